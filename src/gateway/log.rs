//! The call log: one record per call (JSON lines), bounded. Records of calls forwarded
//! upstream and of refused calls are capped separately, so free refusals can never push
//! out the record of a call that was charged; what is dropped is counted, and the log's
//! text then ends with a summary line saying so.

use serde::Serialize;

/// The most records kept of calls forwarded upstream (charged or not: a free upstream
/// error, a zero-priced model, is not bounded by the budget). Beyond it a call is still
/// metered; its record is counted, with its cost, in the log's summary line.
pub const MAX_LOG_RECORDS: usize = 100_000;
/// The most records kept of calls the gateway refused (never forwarded, free).
pub const MAX_REFUSED_RECORDS: usize = 10_000;

/// One call through the gateway, as logged (JSON lines).
#[derive(Debug, Clone, Serialize)]
pub struct CallRecord {
    /// RFC 3339, when the call arrived.
    pub ts: String,
    /// The path the task called.
    pub endpoint: String,
    /// The requested model ("" when none could be read).
    pub model: String,
    pub stream: bool,
    /// The status the task got (0: none, the call was cut off unanswered).
    pub status: u16,
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    pub cost_usd: f64,
    pub latency_ms: f64,
    /// `"usage"` (from the response), `"estimated"` (no usable usage) or `"refused"` (not forwarded).
    pub metered: &'static str,
    pub note: Option<String>,
}

impl CallRecord {
    fn refused(&self) -> bool {
        self.metered == "refused"
    }
}

/// The records kept, in the order the calls were charged, and what was dropped.
#[derive(Debug, Default)]
pub(super) struct CallLog {
    records: Vec<CallRecord>,
    forwarded: usize,
    refused: usize,
    forwarded_dropped: u64,
    forwarded_dropped_usd: f64,
    refused_dropped: u64,
}

/// The last line of a log that dropped records.
#[derive(Debug, Serialize)]
struct Summary<'a> {
    summary: &'a str,
    calls: u64,
    spent_usd: f64,
    records_kept: usize,
    forwarded_records_dropped: u64,
    forwarded_dropped_cost_usd: f64,
    refused_records_dropped: u64,
}

impl CallLog {
    pub(super) fn push(&mut self, record: CallRecord) {
        if record.refused() {
            if self.refused < MAX_REFUSED_RECORDS {
                self.refused += 1;
                self.records.push(record);
            } else {
                self.refused_dropped += 1;
            }
        } else if self.forwarded < MAX_LOG_RECORDS {
            self.forwarded += 1;
            self.records.push(record);
        } else {
            self.forwarded_dropped += 1;
            self.forwarded_dropped_usd += record.cost_usd;
        }
    }

    pub(super) fn records(&self) -> &[CallRecord] {
        &self.records
    }

    pub(super) fn dropped(&self) -> u64 {
        self.forwarded_dropped + self.refused_dropped
    }

    /// The log as JSON lines, one per record kept; when records were dropped, a last line
    /// `{"summary": ..., "calls", "spent_usd", "records_kept", "forwarded_records_dropped",
    /// "forwarded_dropped_cost_usd", "refused_records_dropped"}` says how many (a record
    /// line never has a `summary` field).
    pub(super) fn jsonl(&self, calls: u64, spent_usd: f64) -> serde_json::Result<String> {
        let mut text = String::new();
        for r in &self.records {
            text.push_str(&serde_json::to_string(r)?);
            text.push('\n');
        }
        if self.dropped() > 0 {
            let s = Summary {
                summary: "the call log is bounded: records were dropped (every call was metered)",
                calls,
                spent_usd,
                records_kept: self.records.len(),
                forwarded_records_dropped: self.forwarded_dropped,
                forwarded_dropped_cost_usd: self.forwarded_dropped_usd,
                refused_records_dropped: self.refused_dropped,
            };
            text.push_str(&serde_json::to_string(&s)?);
            text.push('\n');
        }
        Ok(text)
    }
}

#[cfg(test)]
mod tests {
    use super::super::Meter;
    use super::*;
    use serde_json::Value;

    fn record(metered: &'static str, tokens: u64) -> CallRecord {
        CallRecord {
            ts: String::new(),
            endpoint: "/v1/chat/completions".into(),
            model: "m".into(),
            stream: false,
            status: if metered == "refused" { 404 } else { 200 },
            prompt_tokens: tokens,
            completion_tokens: 0,
            cost_usd: tokens as f64,
            latency_ms: 0.0,
            metered,
            note: None,
        }
    }

    #[test]
    fn refusals_never_push_out_charged_records_and_what_is_dropped_is_summed_up() {
        let price = Some(super::super::Price {
            input_per_mtok: 1e6,
            output_per_mtok: 0.0,
        }); // 1 USD per token
        let m = Meter::new(f64::INFINITY);
        // More free refusals (404s) than the old shared cap, then a charged call.
        for _ in 0..=MAX_LOG_RECORDS {
            m.charge(record("refused", 0), None);
        }
        m.charge(record("usage", 2), price);
        let log = m.log();
        assert!(
            log.iter().any(|r| r.metered == "usage"),
            "the charged call's record was dropped"
        );
        assert_eq!(log.len(), MAX_REFUSED_RECORDS + 1);
        let refused_dropped = (MAX_LOG_RECORDS + 1 - MAX_REFUSED_RECORDS) as u64;
        assert_eq!(m.records_dropped(), refused_dropped);
        // Forwarded calls past their own cap: counted, with their cost.
        for _ in 1..MAX_LOG_RECORDS {
            m.charge(record("usage", 1), price);
        }
        m.charge(record("estimated", 3), price);
        m.charge(record("usage", 4), price);
        assert_eq!(m.log().len(), MAX_REFUSED_RECORDS + MAX_LOG_RECORDS);
        let text = m.log_jsonl().unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), MAX_REFUSED_RECORDS + MAX_LOG_RECORDS + 1);
        let first: Value = serde_json::from_str(lines[0]).unwrap();
        assert!(first.get("summary").is_none() && first.get("ts").is_some());
        let summary: Value = serde_json::from_str(lines.last().unwrap()).unwrap();
        assert!(summary["summary"].as_str().unwrap().contains("dropped"));
        assert_eq!(summary["calls"], m.calls());
        assert_eq!(summary["spent_usd"], m.spent_usd());
        assert_eq!(
            summary["records_kept"],
            MAX_REFUSED_RECORDS + MAX_LOG_RECORDS
        );
        assert_eq!(summary["forwarded_records_dropped"], 2);
        assert_eq!(summary["forwarded_dropped_cost_usd"], 7.0);
        assert_eq!(summary["refused_records_dropped"], refused_dropped);
        // What the kept records and the summary say adds up to the spend.
        let kept: f64 = m.log().iter().map(|r| r.cost_usd).sum();
        assert_eq!(kept + 7.0, m.spent_usd());
        // Nothing dropped: no summary line.
        let small = Meter::new(1.0);
        small.charge(record("refused", 0), None);
        assert_eq!(small.log_jsonl().unwrap().lines().count(), 1);
    }
}
