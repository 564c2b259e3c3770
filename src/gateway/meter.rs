//! The API-cost meter shared by the gateway and the supervisor: per-model token totals,
//! the spend against the budget, the worst cases held for calls in flight (a call is
//! admitted only if it fits), the signal once the budget is exhausted, and the call log.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

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

#[derive(Debug, Default)]
struct ModelTotals {
    prompt_tokens: u64,
    completion_tokens: u64,
    price: Option<Price>,
}

/// A call admitted and not yet charged: its worst case, held against the budget.
#[derive(Debug)]
struct Held {
    /// The record charged if the call is never settled: the worst-case tokens and cost.
    worst: CallRecord,
    price: Price,
    started: Instant,
}

#[derive(Debug, Default)]
struct MeterState {
    by_model: BTreeMap<String, ModelTotals>,
    spent_usd: f64,
    calls: u64,
    log: Vec<CallRecord>,
    dropped: u64,
    held: BTreeMap<u64, Held>,
    next_ticket: u64,
}

impl MeterState {
    fn held_usd(&self) -> f64 {
        self.held.values().map(|h| h.worst.cost_usd).sum()
    }
}

/// Why a call was not admitted: its worst case does not fit in what is left of the budget.
#[derive(Debug, Clone, Copy)]
pub(super) struct Shortfall {
    pub(super) budget_usd: f64,
    pub(super) spent_usd: f64,
    /// Held for the calls in flight.
    pub(super) held_usd: f64,
    /// This call's worst case.
    pub(super) need_usd: f64,
}

/// An admitted call's claim on the budget: settled with the call's real record, or, if it
/// is dropped unsettled (the call's task was cancelled), charged its worst case.
#[derive(Debug)]
pub(super) struct Ticket {
    meter: Arc<Meter>,
    id: u64,
    settled: bool,
}

impl Ticket {
    /// Releases the hold and charges the call's real `record` (at the price it was
    /// admitted at). Returns the spend after the charge.
    pub(super) fn settle(mut self, record: CallRecord) -> f64 {
        self.settled = true;
        self.meter.settle(self.id, Some(record))
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        if !self.settled {
            self.meter.settle(self.id, None);
        }
    }
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

    /// True once the spend is over the budget, or once a call was refused because its
    /// worst case did not fit in what was left (the budget is exhausted either way).
    pub fn exceeded(&self) -> bool {
        *self.exceeded.borrow()
    }

    /// Resolves once [`Meter::exceeded`] (at once if it already is).
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

    /// Admits a call whose worst case is `worst` (its tokens and `cost_usd`) at `price`,
    /// if the spend, what calls in flight hold and this call's worst case fit in the
    /// budget: the worst case is then held until the call is settled. Otherwise the
    /// budget is exhausted: exceeded is signalled (no further call is admitted) and the
    /// shortfall returned.
    pub(super) fn reserve(
        self: &Arc<Self>,
        worst: CallRecord,
        price: Price,
        started: Instant,
    ) -> Result<Ticket, Shortfall> {
        let mut s = self.lock();
        let held_usd = s.held_usd();
        let need_usd = worst.cost_usd;
        // NaN never fits.
        let fits = s.spent_usd + held_usd + need_usd <= self.budget_usd;
        if !fits {
            self.exceeded.send_replace(true);
            return Err(Shortfall {
                budget_usd: self.budget_usd,
                spent_usd: s.spent_usd,
                held_usd,
                need_usd,
            });
        }
        s.next_ticket += 1;
        let id = s.next_ticket;
        s.held.insert(
            id,
            Held {
                worst,
                price,
                started,
            },
        );
        Ok(Ticket {
            meter: self.clone(),
            id,
            settled: false,
        })
    }

    /// USD held for calls in flight (their worst cases).
    pub fn held_usd(&self) -> f64 {
        self.lock().held_usd()
    }

    /// Releases ticket `id`'s hold and charges `record`, or its worst case when `None`
    /// (nothing if it was settled already).
    fn settle(&self, id: u64, record: Option<CallRecord>) -> f64 {
        let mut s = self.lock();
        let Some(held) = s.held.remove(&id) else {
            return s.spent_usd;
        };
        let record = record.unwrap_or_else(|| {
            let mut r = held.worst;
            r.latency_ms = held.started.elapsed().as_secs_f64() * 1e3;
            r
        });
        self.charge_locked(&mut s, record, Some(held.price))
    }

    /// Charges a call's tokens at `price` and logs it; signals exceeded when the spend
    /// goes over the budget. Returns the spend after the charge.
    pub fn charge(&self, record: CallRecord, price: Option<Price>) -> f64 {
        let mut s = self.lock();
        self.charge_locked(&mut s, record, price)
    }

    fn charge_locked(&self, s: &mut MeterState, record: CallRecord, price: Option<Price>) -> f64 {
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
