//! The API-cost meter shared by the gateway and the supervisor: per-model token totals,
//! the spend against the budget, the worst cases held for calls in flight (a call is
//! admitted only if it fits), the signal once the budget is exhausted, and the call log.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use tokio::sync::watch;

use super::log::{CallLog, CallRecord};
use super::Price;

#[derive(Debug, Default)]
struct ModelTotals {
    prompt_tokens: u64,
    completion_tokens: u64,
    price: Option<Price>,
}

/// A call admitted and not yet charged: its worst case, held against the budget.
#[derive(Debug)]
struct Held {
    /// The gateway that admitted it (see [`Meter::new_owner`]).
    owner: u64,
    /// The record charged if the call is never settled: the worst-case tokens and cost.
    worst: CallRecord,
    /// What the worst case is made of (for the record's note).
    what: String,
    price: Price,
    started: Instant,
}

/// Why a call is charged its worst case without a record of its own.
#[derive(Debug, Clone, Copy)]
enum Unsettled {
    /// Its task was dropped (cancelled) before it was charged.
    Dropped,
    /// The run ended while it was in flight, and its grace ran out.
    RunEnded,
}

impl Held {
    fn into_record(self, why: Unsettled) -> (CallRecord, Price) {
        let mut r = self.worst;
        r.latency_ms = self.started.elapsed().as_secs_f64() * 1e3;
        let when = match why {
            Unsettled::Dropped => "the call was cut off before its usage was known",
            Unsettled::RunEnded => {
                "the run ended while the call was in flight, and it did not finish within its grace"
            }
        };
        r.note = Some(format!("{when}: charged its worst case, {}", self.what));
        (r, self.price)
    }
}

#[derive(Debug, Default)]
struct MeterState {
    by_model: BTreeMap<String, ModelTotals>,
    spent_usd: f64,
    calls: u64,
    log: CallLog,
    held: BTreeMap<u64, Held>,
    next_ticket: u64,
    next_owner: u64,
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
    /// The upstream answered `status`: what the call's worst-case record says if it is
    /// never settled.
    pub(super) fn answered(&self, status: u16) {
        if let Some(h) = self.meter.lock().held.get_mut(&self.id) {
            h.worst.status = status;
        }
    }

    /// Releases the hold and charges the call's real `record` (at the price it was
    /// admitted at); nothing if the call was charged its worst case already (the run
    /// ended). Returns the spend after the charge.
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

    /// The call records kept (at most [`super::MAX_LOG_RECORDS`] of forwarded calls and
    /// [`super::MAX_REFUSED_RECORDS`] of refused ones), in the order they were charged.
    pub fn log(&self) -> Vec<CallRecord> {
        self.lock().log.records().to_vec()
    }

    /// Calls whose record was not kept because the log was full.
    pub fn records_dropped(&self) -> u64 {
        self.lock().log.dropped()
    }

    /// The call log as JSON lines (the records kept, then, if any was dropped, a summary
    /// line saying how many: see [`super::MAX_LOG_RECORDS`]).
    pub fn log_jsonl(&self) -> serde_json::Result<String> {
        let s = self.lock();
        s.log.jsonl(s.calls, s.spent_usd)
    }

    /// Admits a call whose worst case is `worst` (its tokens and `cost_usd`) at `price`,
    /// if the spend, what calls in flight hold and this call's worst case fit in the
    /// budget: the worst case is then held until the call is settled. Otherwise the
    /// budget is exhausted: exceeded is signalled (no further call is admitted) and the
    /// shortfall returned.
    pub(super) fn reserve(
        self: &Arc<Self>,
        owner: u64,
        worst: CallRecord,
        what: String,
        price: Price,
        started: Instant,
    ) -> Result<Ticket, Shortfall> {
        let mut s = self.lock();
        let held_usd = s.held_usd();
        let need_usd = worst.cost_usd;
        // NaN never fits. Once the budget is exhausted nothing fits, also a call that passed
        // the check at the door before another's refusal and waited for a slot since.
        let fits = !*self.exceeded.borrow() && s.spent_usd + held_usd + need_usd <= self.budget_usd;
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
                owner,
                worst,
                what,
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
        let (record, price) = match record {
            Some(r) => (r, held.price),
            None => held.into_record(Unsettled::Dropped),
        };
        self.charge_locked(&mut s, record, Some(price))
    }

    /// A new owner for the calls one gateway admits (one per run).
    pub(super) fn new_owner(&self) -> u64 {
        let mut s = self.lock();
        s.next_owner += 1;
        s.next_owner
    }

    /// The calls `owner` admitted that are not charged yet.
    pub(super) fn in_flight(&self, owner: u64) -> usize {
        self.lock()
            .held
            .values()
            .filter(|h| h.owner == owner)
            .count()
    }

    /// Charges every call `owner` admitted that is not charged yet its worst case (its run
    /// has ended; the record says so). Returns the spend after.
    pub(super) fn settle_in_flight(&self, owner: u64) -> f64 {
        let mut s = self.lock();
        let ids: Vec<u64> = s
            .held
            .iter()
            .filter(|(_, h)| h.owner == owner)
            .map(|(id, _)| *id)
            .collect();
        for id in ids {
            if let Some(held) = s.held.remove(&id) {
                let (record, price) = held.into_record(Unsettled::RunEnded);
                self.charge_locked(&mut s, record, Some(price));
            }
        }
        s.spent_usd
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
        s.log.push(record);
        let spent = s.spent_usd;
        if spent > self.budget_usd {
            self.exceeded.send_replace(true);
        }
        spent
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

    /// A record of `tokens` prompt tokens at 1 USD per token (its cost filled in).
    fn worst(tokens: u64) -> CallRecord {
        CallRecord {
            ts: String::new(),
            endpoint: "/v1/chat/completions".into(),
            model: "m".into(),
            stream: false,
            status: 0,
            prompt_tokens: tokens,
            completion_tokens: 0,
            cost_usd: tokens as f64,
            latency_ms: 0.0,
            metered: "estimated",
            note: None,
        }
    }

    const DOLLAR_A_TOKEN: Price = Price {
        input_per_mtok: 1e6,
        output_per_mtok: 0.0,
    };

    #[test]
    fn calls_in_flight_are_held_and_charged_their_worst_case_when_unsettled() {
        let m = Meter::new(10.0);
        let (a, b) = (m.new_owner(), m.new_owner());
        let now = Instant::now();
        let reserve = |owner, tokens| {
            m.reserve(
                owner,
                worst(tokens),
                format!("{tokens} tokens"),
                DOLLAR_A_TOKEN,
                now,
            )
        };
        let t1 = reserve(a, 3).unwrap();
        let t2 = reserve(b, 4).unwrap();
        let t3 = reserve(b, 2).unwrap();
        assert_eq!(m.held_usd(), 9.0);
        assert_eq!((m.in_flight(a), m.in_flight(b)), (1, 2));
        // 9 held + 2 more is over 10: refused, and the budget is exhausted.
        let sf = reserve(a, 2).unwrap_err();
        assert_eq!((sf.spent_usd, sf.held_usd, sf.need_usd), (0.0, 9.0, 2.0));
        assert!(m.exceeded());
        // Exhausted: even a call that would fit is refused (one that passed the door's
        // check before the refusal and waited for a slot since).
        assert!(reserve(a, 1).is_err());
        // Settled: the real record replaces the hold.
        let mut real = worst(1);
        real.status = 200;
        real.metered = "usage";
        assert_eq!(t1.settle(real), 1.0);
        assert_eq!((m.held_usd(), m.in_flight(a)), (6.0, 0));
        // Dropped unsettled (its task cancelled): charged its worst case.
        drop(t2);
        assert_eq!(m.spent_usd(), 5.0);
        let log = m.log();
        assert_eq!(log[1].prompt_tokens, 4);
        assert!(
            log[1].note.as_deref().unwrap().contains("cut off"),
            "{log:?}"
        );
        // The run of owner b ends: its last call is charged its worst case, once.
        t3.answered(200);
        assert_eq!(m.settle_in_flight(a), 5.0, "owner a has nothing in flight");
        assert_eq!(m.settle_in_flight(b), 7.0);
        assert_eq!((m.held_usd(), m.in_flight(b)), (0.0, 0));
        let last = m.log().pop().unwrap();
        assert_eq!((last.status, last.metered), (200, "estimated"));
        assert!(last.note.unwrap().contains("the run ended"));
        assert_eq!(
            t3.settle(worst(1)),
            7.0,
            "settled already: not charged again"
        );
        assert_eq!((m.calls(), m.log().len()), (3, 3));
    }
}
