//! The case table shared by the event-stream formats (`go test -json`, libtest JSON): one
//! case assembled from start and finish events over several attempts, so a rerun reads as
//! flaky and a test that started and never finished reads as an error.

use super::{
    clean, clean_message, clean_name, TestCase, TestOutcome, MAX_MESSAGE_CHARS, MAX_TEST_CASES,
};

/// How one attempt of a test ended.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Attempt {
    Pass,
    Fail,
    Skip,
}

/// A test case assembled from start/finish events, possibly over several attempts
/// (`go test -count`, or a rerun tool concatenating streams).
pub(super) struct EventCase {
    pub(super) name: String,
    pub(super) passes: u32,
    pub(super) fails: u32,
    pub(super) last: Option<Attempt>,
    /// Started (`run`/`started`) and not finished yet.
    pub(super) running: bool,
    pub(super) time_s: Option<f64>,
    /// Output of the current attempt (bounded), used for the failure/skip message.
    pub(super) output: String,
    pub(super) fail_message: Option<String>,
    pub(super) skip_message: Option<String>,
    /// Set when the stream shows the test could not finish (crash, kill, timeout).
    pub(super) unfinished: Option<String>,
}

impl EventCase {
    pub(super) fn new(name: String) -> Self {
        EventCase {
            name,
            passes: 0,
            fails: 0,
            last: None,
            running: false,
            time_s: None,
            output: String::new(),
            fail_message: None,
            skip_message: None,
            unfinished: None,
        }
    }

    pub(super) fn start(&mut self) {
        self.running = true;
        self.output.clear();
    }

    /// Record a finished attempt; `message` is the event's own message, if it has one.
    pub(super) fn finish(&mut self, attempt: Attempt, time_s: Option<f64>, message: Option<&str>) {
        self.running = false;
        self.last = Some(attempt);
        if let Some(t) = time_s.filter(|t| t.is_finite() && *t >= 0.0) {
            self.time_s = Some(t);
        }
        let text = match message {
            Some(m) if !m.trim().is_empty() => clean_message(m),
            _ => clean_message(&self.output),
        };
        match attempt {
            Attempt::Pass => self.passes = self.passes.saturating_add(1),
            Attempt::Fail => {
                self.fails = self.fails.saturating_add(1);
                if self.fail_message.is_none() {
                    self.fail_message = text;
                }
            }
            Attempt::Skip => {
                if self.skip_message.is_none() {
                    self.skip_message = text;
                }
            }
        }
        self.output.clear();
    }

    /// The finished case; `None` for a name that only ever had output (a benchmark's log).
    pub(super) fn build(self) -> Option<TestCase> {
        if self.last.is_none() && !self.running && self.unfinished.is_none() {
            return None;
        }
        let (outcome, message) = if self.running || self.unfinished.is_some() {
            let why = self.unfinished.unwrap_or_else(|| {
                "started but never finished: the stream ends first (crash, kill or timeout)".into()
            });
            let mut m = why;
            if let Some(out) = clean_message(&self.output) {
                m.push_str("; last output: ");
                m.push_str(&out);
            }
            (TestOutcome::Error, Some(clean(&m, MAX_MESSAGE_CHARS, true)))
        } else {
            match self.last {
                Some(Attempt::Fail) => {
                    let mut m = self.fail_message.unwrap_or_default();
                    if self.passes > 0 {
                        let attempts = self.passes.saturating_add(self.fails);
                        m = format!(
                            "failed the last attempt ({} of {attempts} failed); {m}",
                            self.fails
                        );
                    }
                    (TestOutcome::Failed, clean_message(&m))
                }
                Some(Attempt::Pass) if self.fails > 0 => {
                    let plural = if self.fails == 1 { "" } else { "s" };
                    let mut m = format!("passed after {} failed attempt{plural}", self.fails);
                    if let Some(first) = self.fail_message {
                        m.push_str("; first failure: ");
                        m.push_str(&first);
                    }
                    (TestOutcome::Flaky, Some(clean(&m, MAX_MESSAGE_CHARS, true)))
                }
                Some(Attempt::Pass) => (TestOutcome::Passed, None),
                // A skip after a failed attempt does not hide the failure.
                Some(Attempt::Skip) if self.fails > 0 => (TestOutcome::Failed, self.fail_message),
                Some(Attempt::Skip) if self.passes > 0 => (TestOutcome::Passed, None),
                Some(Attempt::Skip) | None => (TestOutcome::Skipped, self.skip_message),
            }
        };
        Some(TestCase {
            name: self.name,
            classname: None,
            outcome,
            time_s: self.time_s,
            message,
        })
    }
}

/// Cases in order of first appearance, found by a key.
pub(super) struct CaseTable<K> {
    pub(super) cases: Vec<EventCase>,
    pub(super) index: std::collections::HashMap<K, usize>,
}

impl<K: std::hash::Hash + Eq> CaseTable<K> {
    pub(super) fn new() -> Self {
        CaseTable {
            cases: Vec::new(),
            index: std::collections::HashMap::new(),
        }
    }

    /// The index of the case for `key`, created with `name()` on first sight; `None` over
    /// [`MAX_TEST_CASES`].
    pub(super) fn slot(&mut self, key: K, name: impl FnOnce() -> String) -> Option<usize> {
        let i = match self.index.get(&key) {
            Some(&i) => i,
            None => {
                if self.cases.len() >= MAX_TEST_CASES {
                    return None;
                }
                self.cases.push(EventCase::new(clean_name(&name())));
                self.index.insert(key, self.cases.len() - 1);
                self.cases.len() - 1
            }
        };
        Some(i)
    }

    pub(super) fn into_cases(self) -> Vec<TestCase> {
        self.cases
            .into_iter()
            .filter_map(EventCase::build)
            .collect()
    }
}

/// The lines of a JSON-lines stream as `(line number, text)`, skipping blank lines.
pub(super) fn json_lines(text: &str) -> impl Iterator<Item = (usize, &str)> {
    text.split('\n').enumerate().filter_map(|(i, l)| {
        let l = l.strip_suffix('\r').unwrap_or(l).trim();
        (!l.is_empty()).then_some((i + 1, l))
    })
}
