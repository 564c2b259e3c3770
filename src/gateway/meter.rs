//! The API-cost meter shared by the gateway and the supervisor: per-model token totals,
//! the spend against the budget, the signal once it is exceeded, and the call log.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};

use serde::Serialize;
use tokio::sync::watch;

use super::Price;

/// The most call records kept (further calls are still metered, their records counted).
pub const MAX_LOG_RECORDS: usize = 100_000;

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
    /// The status the task got.
    pub status: u16,
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    pub cost_usd: f64,
    pub latency_ms: f64,
    /// `"usage"` (from the response), `"estimated"` (no usable usage) or `"refused"` (not forwarded).
    pub metered: &'static str,
    pub note: Option<String>,
}

#[derive(Debug, Default)]
struct ModelTotals {
    prompt_tokens: u64,
    completion_tokens: u64,
    price: Option<Price>,
}

#[derive(Debug, Default)]
struct MeterState {
    by_model: BTreeMap<String, ModelTotals>,
    spent_usd: f64,
    calls: u64,
    log: Vec<CallRecord>,
    dropped: u64,
}

/// The API-cost meter, shared by the gateway and the supervisor. Race-free (one mutex).
///
/// The spend is computed from per-model token totals (exact integers) and their prices,
/// so it does not depend on the order in which parallel calls were charged.
#[derive(Debug)]
pub struct Meter {
    budget_usd: f64,
    state: Mutex<MeterState>,
    exceeded: watch::Sender<bool>,
}

impl Meter {
    /// A meter for `budget_usd` (use `f64::INFINITY` for no limit; a NaN or negative
    /// budget is taken as 0: fail closed).
    pub fn new(budget_usd: f64) -> Arc<Meter> {
        let budget_usd = if budget_usd.is_nan() || budget_usd < 0.0 {
            0.0
        } else {
            budget_usd
        };
        Arc::new(Meter {
            budget_usd,
            state: Mutex::new(MeterState::default()),
            exceeded: watch::channel(false).0,
        })
    }

    fn lock(&self) -> MutexGuard<'_, MeterState> {
        // A panic while holding the lock cannot leave the totals half-updated in a way
        // that matters more than losing the meter: keep metering.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn budget_usd(&self) -> f64 {
        self.budget_usd
    }

    /// The USD spent so far.
    pub fn spent_usd(&self) -> f64 {
        self.lock().spent_usd
    }

    /// Every call recorded (refused ones included).
    pub fn calls(&self) -> u64 {
        self.lock().calls
    }

    /// (prompt, completion) tokens charged so far, all models.
    pub fn tokens(&self) -> (u64, u64) {
        let s = self.lock();
        s.by_model.values().fold((0, 0), |(p, c), t| {
            (
                p.saturating_add(t.prompt_tokens),
                c.saturating_add(t.completion_tokens),
            )
        })
    }

    /// True once the spend is over the budget.
    pub fn exceeded(&self) -> bool {
        *self.exceeded.borrow()
    }

    /// Resolves once the spend is over the budget (at once if it already is).
    pub async fn exceeded_signal(&self) {
        let mut rx = self.exceeded.subscribe();
        // The sender lives in `self`, so `wait_for` cannot fail while we are borrowed.
        let _ = rx.wait_for(|e| *e).await;
    }

    /// The call records kept (at most [`MAX_LOG_RECORDS`]).
    pub fn log(&self) -> Vec<CallRecord> {
        self.lock().log.clone()
    }

    /// Calls whose record was not kept because the log was full.
    pub fn records_dropped(&self) -> u64 {
        self.lock().dropped
    }

    /// Charges a call's tokens at `price` and logs it; signals exceeded when the spend
    /// goes over the budget. Returns the spend after the charge.
    pub fn charge(&self, record: CallRecord, price: Option<Price>) -> f64 {
        let mut s = self.lock();
        if let Some(price) = price {
            if record.prompt_tokens > 0 || record.completion_tokens > 0 {
                let t = s.by_model.entry(record.model.clone()).or_default();
                t.prompt_tokens = t.prompt_tokens.saturating_add(record.prompt_tokens);
                t.completion_tokens = t.completion_tokens.saturating_add(record.completion_tokens);
                t.price = Some(price);
                s.spent_usd = s
                    .by_model
                    .values()
                    .map(|t| {
                        t.price
                            .map_or(0.0, |p| p.cost(t.prompt_tokens, t.completion_tokens))
                    })
                    .sum();
            }
        }
        s.calls += 1;
        if s.log.len() < MAX_LOG_RECORDS {
            s.log.push(record);
        } else {
            s.dropped += 1;
        }
        let spent = s.spent_usd;
        if spent > self.budget_usd {
            self.exceeded.send_replace(true);
        }
        spent
    }
}

impl crate::sandbox::CostMeter for Meter {
    fn spent_usd(&self) -> f64 {
        Meter::spent_usd(self)
    }
    fn exceeded(&self) -> bool {
        Meter::exceeded(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn the_meter_signals_once_over_budget_and_fails_closed() {
        let m = Meter::new(0.5);
        let rec = |tokens: u64| CallRecord {
            ts: String::new(),
            endpoint: "/v1/chat/completions".into(),
            model: "m".into(),
            stream: false,
            status: 200,
            prompt_tokens: tokens,
            completion_tokens: 0,
            cost_usd: 0.0,
            latency_ms: 0.0,
            metered: "usage",
            note: None,
        };
        let price = Some(Price {
            input_per_mtok: 1e6,
            output_per_mtok: 0.0,
        }); // 1 USD per token
        assert!(!m.exceeded());
        let waiter = {
            let m = m.clone();
            tokio::spawn(async move { m.exceeded_signal().await })
        };
        m.charge(rec(0), price);
        assert!(!m.exceeded(), "a free call does not exceed");
        m.charge(rec(1), price);
        assert!(m.exceeded());
        tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .unwrap()
            .unwrap();
        // At once when already exceeded.
        tokio::time::timeout(Duration::from_secs(1), m.exceeded_signal())
            .await
            .unwrap();
        assert_eq!(m.calls(), 2);
        assert_eq!(Meter::new(f64::NAN).budget_usd(), 0.0);
        assert_eq!(Meter::new(-3.0).budget_usd(), 0.0);
        let unlimited = Meter::new(f64::INFINITY);
        unlimited.charge(rec(1_000_000), price);
        assert!(!unlimited.exceeded());
    }
}
