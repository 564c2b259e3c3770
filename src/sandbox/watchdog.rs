//! The watchdog: what a run may use ([`Limits`]), what it used ([`Usage`]), and which
//! budget it blew ([`BudgetKind`]).
//!
//! The kernel enforces memory (OOM kill), CPU rate (throttling) and pids (fork fails) in
//! the cgroup; the disk budget is the size of the filesystem holding the workspace and
//! /tmp. The watchdog (driven by the supervisor's tokio loop) turns each of these into a
//! kill of the whole sandbox and names the budget: a blown budget ends the successor.

use serde::{Deserialize, Serialize};
use std::time::Duration;

/// The limits of one sandbox run.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Limits {
    #[serde(serialize_with = "ser_secs")]
    pub wall: Duration,
    /// CPU share in percent of one core (200 = two cores).
    pub cpu_percent: u32,
    pub memory_bytes: u64,
    pub pids: u64,
    /// The capped filesystem holding the workspace and /tmp.
    pub disk_bytes: u64,
    /// Total CPU time, when limited.
    #[serde(serialize_with = "ser_opt_secs")]
    pub cpu_time: Option<Duration>,
}

/// A duration serialized as seconds (reports and verdicts spell limits so).
pub fn ser_secs<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64(d.as_secs_f64())
}
/// An optional duration serialized as seconds, or null.
pub fn ser_opt_secs<S: serde::Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
    match d {
        Some(d) => s.serialize_some(&d.as_secs_f64()),
        None => s.serialize_none(),
    }
}

/// The budget that ended a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BudgetKind {
    Wall,
    Cpu,
    Memory,
    Pids,
    Disk,
    ApiCost,
}

impl BudgetKind {
    pub fn as_str(self) -> &'static str {
        match self {
            BudgetKind::Wall => "wall",
            BudgetKind::Cpu => "cpu",
            BudgetKind::Memory => "memory",
            BudgetKind::Pids => "pids",
            BudgetKind::Disk => "disk",
            BudgetKind::ApiCost => "api_cost",
        }
    }
}

/// What a run used.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Usage {
    pub wall_s: f64,
    pub cpu_s: f64,
    pub memory_peak_bytes: u64,
    pub disk_bytes: u64,
    pub pids_peak: u64,
    pub api_cost_usd: f64,
}

/// One observation of the sandbox by the supervisor.
#[derive(Debug, Clone, Default)]
pub struct Observation {
    pub elapsed: Duration,
    pub cpu_ns: u64,
    pub memory_peak: u64,
    /// Memory in the cgroup now.
    pub memory_current: u64,
    /// Bytes queued on the sandbox's netlink sockets, which no cgroup charges (see
    /// `supervisor::NetlinkQueues`): counted with `memory_current` against the budget.
    pub netlink_queued: u64,
    pub pids_current: u64,
    pub pids_peak: Option<u64>,
    pub oom_kills: u64,
    pub pids_limit_hits: u64,
    /// Bytes used on the capped filesystem, and its size.
    pub disk_used: Option<u64>,
    pub disk_size: Option<u64>,
}

/// Slack under the disk size at which the filesystem counts as full (tmpfs rounds to pages).
pub const DISK_FULL_SLACK: u64 = 64 * 1024;

/// How often the disk is looked at while it is near full (see [`Watchdog::disk_near_full`]);
/// otherwise with every other budget, every 50 ms. One look is a statvfs (a few
/// microseconds).
pub const DISK_NEAR_EVERY: Duration = Duration::from_millis(10);

/// Accumulates usage and decides when a budget is blown.
#[derive(Debug, Clone)]
pub struct Watchdog {
    limits: Limits,
    usage: Usage,
    /// The disk's use at the last look and the look before, and its size.
    disk_last: Option<(u64, u64)>,
    disk_before: Option<u64>,
}

impl Watchdog {
    pub fn new(limits: Limits) -> Self {
        Watchdog {
            limits,
            usage: Usage::default(),
            disk_last: None,
            disk_before: None,
        }
    }

    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// Folds an observation in; returns the budget it shows blown, if any. Checked in a
    /// fixed order so the report is deterministic: memory, pids, disk, cpu, wall.
    pub fn observe(&mut self, o: &Observation) -> Option<BudgetKind> {
        let u = &mut self.usage;
        u.wall_s = o.elapsed.as_secs_f64();
        u.cpu_s = u.cpu_s.max(o.cpu_ns as f64 / 1e9);
        let held = o.memory_current.saturating_add(o.netlink_queued);
        u.memory_peak_bytes = u.memory_peak_bytes.max(o.memory_peak);
        if o.netlink_queued > 0 {
            u.memory_peak_bytes = u.memory_peak_bytes.max(held);
        }
        u.pids_peak = u
            .pids_peak
            .max(o.pids_current)
            .max(o.pids_peak.unwrap_or(0));
        let disk_full = match (o.disk_used, o.disk_size) {
            (Some(used), Some(size)) => self.observe_disk(used, size).is_some(),
            _ => false,
        };
        if o.oom_kills > 0 || (o.netlink_queued > 0 && held > self.limits.memory_bytes) {
            return Some(BudgetKind::Memory);
        }
        if o.pids_limit_hits > 0 {
            return Some(BudgetKind::Pids);
        }
        if disk_full {
            return Some(BudgetKind::Disk);
        }
        if let Some(ct) = self.limits.cpu_time {
            if o.cpu_ns as f64 / 1e9 >= ct.as_secs_f64() {
                return Some(BudgetKind::Cpu);
            }
        }
        if o.elapsed >= self.limits.wall {
            return Some(BudgetKind::Wall);
        }
        None
    }

    /// Folds in one look at the disk (`used` of `size` bytes): the recorded use is the
    /// largest seen; `Disk` when it is full. tmpfs counts no failed write, so a fill
    /// released between two looks (a file unlinked while open, then closed) is seen only
    /// as the use of the looks around it.
    pub fn observe_disk(&mut self, used: u64, size: u64) -> Option<BudgetKind> {
        self.usage.disk_bytes = self.usage.disk_bytes.max(used);
        self.disk_before = self.disk_last.map(|(u, _)| u);
        self.disk_last = Some((used, size));
        (used + DISK_FULL_SLACK >= size).then_some(BudgetKind::Disk)
    }

    /// Whether the disk is near full, to be looked at every [`DISK_NEAR_EVERY`] rather
    /// than every tick: less than a tenth of it is free, or less than twice what the last
    /// look saw added (at that pace it would be full before the look after next).
    pub fn disk_near_full(&self) -> bool {
        let Some((used, size)) = self.disk_last else {
            return false;
        };
        let room = size.saturating_sub(used);
        let grew = used.saturating_sub(self.disk_before.unwrap_or(used));
        room <= size / 10 || room <= grew.saturating_mul(2)
    }

    pub fn usage(&self) -> &Usage {
        &self.usage
    }

    pub fn set_api_cost(&mut self, usd: f64) {
        self.usage.api_cost_usd = usd;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seed_budgets() -> Limits {
        Limits {
            wall: Duration::from_secs(3600),
            cpu_percent: 200,
            memory_bytes: 2 << 30,
            pids: 512,
            disk_bytes: 10 << 30,
            cpu_time: None,
        }
    }

    #[test]
    fn wall_trips_at_limit() {
        let mut b = seed_budgets();
        b.wall = Duration::from_secs(2);
        let mut w = Watchdog::new(b);
        let mut o = Observation {
            elapsed: Duration::from_millis(1900),
            ..Default::default()
        };
        assert_eq!(w.observe(&o), None);
        o.elapsed = Duration::from_millis(2000);
        assert_eq!(w.observe(&o), Some(BudgetKind::Wall));
        assert!((w.usage().wall_s - 2.0).abs() < 1e-9);
    }

    #[test]
    fn kernel_events_name_their_budget() {
        let mut w = Watchdog::new(seed_budgets());
        let o = Observation {
            oom_kills: 1,
            memory_peak: 100,
            ..Default::default()
        };
        assert_eq!(w.observe(&o), Some(BudgetKind::Memory));
        assert_eq!(w.usage().memory_peak_bytes, 100);
        let o = Observation {
            pids_limit_hits: 3,
            pids_current: 64,
            ..Default::default()
        };
        assert_eq!(w.observe(&o), Some(BudgetKind::Pids));
        assert_eq!(w.usage().pids_peak, 64);
        let o = Observation {
            disk_used: Some((64 << 20) - 4096),
            disk_size: Some(64 << 20),
            ..Default::default()
        };
        assert_eq!(w.observe(&o), Some(BudgetKind::Disk));
        let o = Observation {
            disk_used: Some(1 << 20),
            disk_size: Some(64 << 20),
            ..Default::default()
        };
        assert_eq!(w.observe(&o), None);
    }

    #[test]
    fn cpu_time_only_when_set() {
        let mut b = seed_budgets();
        let o = Observation {
            cpu_ns: 10_000_000_000,
            ..Default::default()
        };
        assert_eq!(Watchdog::new(b.clone()).observe(&o), None);
        b.cpu_time = Some(Duration::from_secs(5));
        assert_eq!(Watchdog::new(b).observe(&o), Some(BudgetKind::Cpu));
    }

    #[test]
    fn netlink_queues_count_against_the_memory_budget() {
        let mut b = seed_budgets();
        b.memory_bytes = 32 << 20;
        let mut w = Watchdog::new(b);
        let mut o = Observation {
            memory_current: 20 << 20,
            memory_peak: 20 << 20,
            netlink_queued: 10 << 20,
            ..Default::default()
        };
        assert_eq!(w.observe(&o), None);
        assert_eq!(w.usage().memory_peak_bytes, 30 << 20);
        o.netlink_queued = 13 << 20;
        assert_eq!(w.observe(&o), Some(BudgetKind::Memory));
        assert_eq!(w.usage().memory_peak_bytes, 33 << 20);
    }

    /// The recorded disk use is the largest any look saw, not the last: a file that
    /// filled most of the disk and was deleted (or unlinked while open, then closed)
    /// before the run ended is still in the usage.
    #[test]
    fn the_recorded_disk_use_is_the_largest_seen() {
        let mut w = Watchdog::new(seed_budgets());
        let size = 64 << 20;
        assert_eq!(w.observe_disk(1 << 20, size), None);
        assert_eq!(w.observe_disk(55 << 20, size), None);
        assert_eq!(w.observe_disk(8 << 10, size), None);
        assert_eq!(w.usage().disk_bytes, 55 << 20);
        let o = Observation {
            disk_used: Some(4 << 10),
            disk_size: Some(size),
            ..Default::default()
        };
        assert_eq!(w.observe(&o), None);
        assert_eq!(w.usage().disk_bytes, 55 << 20);
        assert_eq!(w.observe_disk(size - 4096, size), Some(BudgetKind::Disk));
    }

    /// The disk is looked at more often when it is near full: under a tenth of it free,
    /// or less free than twice what the last look saw added; not before any look, nor
    /// when it is far from full and growing slowly, or shrinking.
    #[test]
    fn the_disk_is_looked_at_more_often_when_near_full() {
        let size: u64 = 100 << 20;
        let mut w = Watchdog::new(seed_budgets());
        assert!(!w.disk_near_full(), "no look yet");
        w.observe_disk(10 << 20, size);
        assert!(!w.disk_near_full());
        w.observe_disk(12 << 20, size);
        assert!(!w.disk_near_full(), "2 MiB added, 88 MiB free");
        w.observe_disk(91 << 20, size);
        assert!(w.disk_near_full(), "under a tenth free");
        w.observe_disk(20 << 20, size);
        assert!(!w.disk_near_full(), "freed again");
        // 45 MiB added since the last look, 35 MiB free: full before the look after next.
        w.observe_disk(65 << 20, size);
        assert!(w.disk_near_full());
        // Through `observe` too (a tick's look).
        let mut w = Watchdog::new(seed_budgets());
        let look = |used| Observation {
            disk_used: Some(used),
            disk_size: Some(size),
            ..Default::default()
        };
        w.observe(&look(1 << 20));
        assert!(!w.disk_near_full());
        w.observe(&look(95 << 20));
        assert!(w.disk_near_full());
    }

    #[test]
    fn peaks_only_grow() {
        let mut w = Watchdog::new(seed_budgets());
        w.observe(&Observation {
            memory_peak: 500,
            pids_current: 9,
            ..Default::default()
        });
        w.observe(&Observation {
            memory_peak: 200,
            pids_current: 2,
            ..Default::default()
        });
        assert_eq!(w.usage().memory_peak_bytes, 500);
        assert_eq!(w.usage().pids_peak, 9);
    }
}
