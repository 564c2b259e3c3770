//! Budgets: the one pipeline every limit goes through.
//!
//! A limit is written by people in three places (a policy's `[budget]`, a fork.toml task's
//! `budget = {...}`, the command line's flags) and read back by machines from one (a
//! verdict's `budget.limits`, which `fork reverify` reproduces). All of them become a
//! [`BudgetText`] (human units, as written) or directly a [`BudgetOverrides`] (typed), and
//! only [`Budgets::apply`] turns overrides into limits, validating every value the same way
//! whatever its origin.
//!
//! Two scopes: every sandbox run gets the per-run limits ([`Budgets::run_limits`]); the
//! evaluation as a whole (its repeats, reruns, replicas and baseline together) is bounded
//! by `evaluation_wall`, recorded beside them.

use crate::sandbox::watchdog::{ser_opt_secs, ser_secs};
use crate::sandbox::{BudgetKind, Limits, Usage};
use serde::de::{self, Deserializer, Visitor};
use serde::{Deserialize, Serialize};
use std::fmt;
use std::time::Duration;
use thiserror::Error;

/// One budget field, as it is spelled in policies, fork.toml and verdicts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BudgetField {
    Wall,
    Cpu,
    Memory,
    Pids,
    Disk,
    ApiCost,
    CpuTime,
    EvaluationWall,
}

impl BudgetField {
    pub fn name(self) -> &'static str {
        match self {
            BudgetField::Wall => "wall",
            BudgetField::Cpu => "cpu",
            BudgetField::Memory => "memory",
            BudgetField::Pids => "pids",
            BudgetField::Disk => "disk",
            BudgetField::ApiCost => "api_cost",
            BudgetField::CpuTime => "cpu_time",
            BudgetField::EvaluationWall => "evaluation_wall",
        }
    }
}

impl fmt::Display for BudgetField {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The budget that ended an evaluation: one run's, or the evaluation's own wall.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exceeded {
    /// A per-run budget, as the sandbox's watchdog named it (or the API cost, which the
    /// whole evaluation's runs share).
    Run(BudgetKind),
    /// The evaluation's runs together reached `evaluation_wall`.
    EvaluationWall,
}

impl Exceeded {
    /// As verdicts spell it in `budget.exceeded`.
    pub fn name(self) -> &'static str {
        match self {
            Exceeded::Run(k) => k.as_str(),
            Exceeded::EvaluationWall => BudgetField::EvaluationWall.name(),
        }
    }

    /// As a sentence names it.
    pub fn label(self) -> &'static str {
        match self {
            Exceeded::Run(BudgetKind::Wall) => "wall-clock time",
            Exceeded::Run(BudgetKind::Cpu) => "CPU time",
            Exceeded::Run(BudgetKind::Memory) => "memory",
            Exceeded::Run(BudgetKind::Pids) => "process count",
            Exceeded::Run(BudgetKind::Disk) => "disk",
            Exceeded::Run(BudgetKind::ApiCost) => "API cost",
            Exceeded::EvaluationWall => "evaluation's wall-clock time",
        }
    }
}

/// A budget value that is not acceptable: `budget.<field>` and why, with the fix.
#[derive(Debug, Clone, Error, PartialEq, Eq)]
#[error("budget.{field}: {message}")]
pub struct BudgetError {
    pub field: BudgetField,
    pub message: String,
}

fn bad(field: BudgetField, message: impl Into<String>) -> BudgetError {
    BudgetError {
        field,
        message: message.into(),
    }
}

/// The limits of every run and of the evaluation, resolved to numbers.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Budgets {
    #[serde(serialize_with = "ser_secs")]
    pub wall: Duration,
    pub cpu_percent: u32,
    pub memory_bytes: u64,
    pub pids: u64,
    pub disk_bytes: u64,
    pub api_cost_usd: f64,
    #[serde(serialize_with = "ser_opt_secs")]
    pub cpu_time: Option<Duration>,
    /// The whole evaluation's wall-clock time (every run of it together).
    #[serde(serialize_with = "ser_secs")]
    pub evaluation_wall: Duration,
}

impl Default for Budgets {
    /// The defaults for anything a policy leaves out: wall 1 h (per run and for the whole
    /// evaluation), CPU 200 %, memory 2 GiB, 512 processes, disk 10 GiB, API cost $5.
    fn default() -> Budgets {
        Budgets {
            wall: Duration::from_secs(3600),
            cpu_percent: 200,
            memory_bytes: 2 << 30,
            pids: 512,
            disk_bytes: 10 << 30,
            api_cost_usd: 5.0,
            cpu_time: None,
            evaluation_wall: Duration::from_secs(3600),
        }
    }
}

impl Budgets {
    /// Sets what `o` sets, after checking every value (the same checks whatever the origin).
    pub fn apply(&mut self, o: &BudgetOverrides) -> Result<(), BudgetError> {
        o.validate()?;
        let BudgetOverrides {
            wall,
            cpu_percent,
            memory_bytes,
            pids,
            disk_bytes,
            api_cost_usd,
            cpu_time,
            evaluation_wall,
        } = *o;
        set(&mut self.wall, wall);
        set(&mut self.cpu_percent, cpu_percent);
        set(&mut self.memory_bytes, memory_bytes);
        set(&mut self.pids, pids);
        set(&mut self.disk_bytes, disk_bytes);
        set(&mut self.api_cost_usd, api_cost_usd);
        if cpu_time.is_some() {
            self.cpu_time = cpu_time;
        }
        set(&mut self.evaluation_wall, evaluation_wall);
        Ok(())
    }

    /// What one sandbox run may use.
    pub fn run_limits(&self) -> Limits {
        Limits {
            wall: self.wall,
            cpu_percent: self.cpu_percent,
            memory_bytes: self.memory_bytes,
            pids: self.pids,
            disk_bytes: self.disk_bytes,
            cpu_time: self.cpu_time,
        }
    }

    /// These limits as overrides (every field set): how a verdict's budget is replayed.
    pub fn as_overrides(&self) -> BudgetOverrides {
        BudgetOverrides {
            wall: Some(self.wall),
            cpu_percent: Some(self.cpu_percent),
            memory_bytes: Some(self.memory_bytes),
            pids: Some(self.pids),
            disk_bytes: Some(self.disk_bytes),
            api_cost_usd: Some(self.api_cost_usd),
            cpu_time: self.cpu_time,
            evaluation_wall: Some(self.evaluation_wall),
        }
    }
}

fn set<T>(slot: &mut T, v: Option<T>) {
    if let Some(v) = v {
        *slot = v;
    }
}

/// Some limits, typed; `None` leaves a limit as it was.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct BudgetOverrides {
    pub wall: Option<Duration>,
    pub cpu_percent: Option<u32>,
    pub memory_bytes: Option<u64>,
    pub pids: Option<u64>,
    pub disk_bytes: Option<u64>,
    pub api_cost_usd: Option<f64>,
    pub cpu_time: Option<Duration>,
    pub evaluation_wall: Option<Duration>,
}

/// The smallest memory budget: below it the sandbox's own init cannot start.
pub const MIN_MEMORY_BYTES: u64 = 8 << 20;
/// The smallest disk budget.
pub const MIN_DISK_BYTES: u64 = 1 << 20;
/// The largest CPU share, in percent of one core.
pub const MAX_CPU_PERCENT: u32 = 100 * 1024;
/// The most processes a budget may allow: the kernel's own ceiling on pids (PID_MAX_LIMIT
/// on 64-bit), which the cgroup's `pids.max` cannot exceed.
pub const MAX_PIDS: u64 = 4 << 20;

impl BudgetOverrides {
    /// Every set value in range, or the first that is not, named, with the fix.
    pub fn validate(&self) -> Result<(), BudgetError> {
        let positive = |field, d: Option<Duration>| match d {
            Some(d) if d.is_zero() => Err(bad(
                field,
                "must be more than 0: write a positive duration like 30s, 10m or 1h",
            )),
            _ => Ok(()),
        };
        positive(BudgetField::Wall, self.wall)?;
        positive(BudgetField::CpuTime, self.cpu_time)?;
        positive(BudgetField::EvaluationWall, self.evaluation_wall)?;
        if let Some(c) = self.cpu_percent {
            if c == 0 || c > MAX_CPU_PERCENT {
                return Err(bad(
                    BudgetField::Cpu,
                    format!("{c} is out of range: give a percentage of one core, 1 to {MAX_CPU_PERCENT} (200 = two cores)"),
                ));
            }
        }
        if let Some(m) = self.memory_bytes {
            if m < MIN_MEMORY_BYTES {
                return Err(bad(
                    BudgetField::Memory,
                    format!("{m} bytes is too little: the memory budget must be at least 8MiB"),
                ));
            }
        }
        if let Some(p) = self.pids {
            if p < 2 {
                return Err(bad(
                    BudgetField::Pids,
                    format!("{p} is too few: at least 2 (the sandbox's init and the command)"),
                ));
            }
            if p > MAX_PIDS {
                return Err(bad(
                    BudgetField::Pids,
                    format!("{p} is too many: at most {MAX_PIDS} (the kernel's limit on pids)"),
                ));
            }
        }
        if let Some(d) = self.disk_bytes {
            if d < MIN_DISK_BYTES {
                return Err(bad(
                    BudgetField::Disk,
                    format!("{d} bytes is too little: the disk budget must be at least 1MiB"),
                ));
            }
        }
        if let Some(a) = self.api_cost_usd {
            if !(a.is_finite() && a >= 0.0) {
                return Err(bad(
                    BudgetField::ApiCost,
                    "must be a non-negative number of USD, like \"5.00\"",
                ));
            }
        }
        Ok(())
    }
}

/// Budget values as people write them, in human units (`"10m"`, `"1GiB"`, `"200%"`,
/// `"$5"`; numbers are accepted and kept as their decimal text). The same shape in a
/// policy's `[budget]`, a task's `budget = {...}` and the command line's flags.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BudgetText {
    #[serde(
        default,
        deserialize_with = "human",
        skip_serializing_if = "Option::is_none"
    )]
    pub wall: Option<String>,
    #[serde(
        default,
        deserialize_with = "human",
        skip_serializing_if = "Option::is_none"
    )]
    pub memory: Option<String>,
    /// Percent of one CPU ("200" = two CPUs; "200%" also accepted).
    #[serde(
        default,
        deserialize_with = "human",
        skip_serializing_if = "Option::is_none"
    )]
    pub cpu: Option<String>,
    #[serde(
        default,
        deserialize_with = "human",
        skip_serializing_if = "Option::is_none"
    )]
    pub disk: Option<String>,
    #[serde(
        default,
        deserialize_with = "human",
        skip_serializing_if = "Option::is_none"
    )]
    pub pids: Option<String>,
    /// US dollars ("5.00" or "$5").
    #[serde(
        default,
        deserialize_with = "human",
        skip_serializing_if = "Option::is_none"
    )]
    pub api_cost: Option<String>,
    /// Total CPU time of a run, e.g. "10m" (the run is killed when it passes).
    #[serde(
        default,
        deserialize_with = "human",
        skip_serializing_if = "Option::is_none"
    )]
    pub cpu_time: Option<String>,
    /// The whole evaluation's wall-clock time, e.g. "2h".
    #[serde(
        default,
        deserialize_with = "human",
        skip_serializing_if = "Option::is_none"
    )]
    pub evaluation_wall: Option<String>,
}

impl BudgetText {
    /// Parses and validates every set value.
    pub fn parse(&self) -> Result<BudgetOverrides, BudgetError> {
        fn get<T>(
            field: BudgetField,
            v: &Option<String>,
            f: impl Fn(&str) -> Result<T, String>,
        ) -> Result<Option<T>, BudgetError> {
            v.as_deref()
                .map(|s| f(s).map_err(|m| bad(field, m)))
                .transpose()
        }
        let o = BudgetOverrides {
            wall: get(BudgetField::Wall, &self.wall, parse_wall)?,
            memory_bytes: get(BudgetField::Memory, &self.memory, parse_bytes)?,
            cpu_percent: get(BudgetField::Cpu, &self.cpu, parse_cpu)?,
            disk_bytes: get(BudgetField::Disk, &self.disk, parse_bytes)?,
            pids: get(BudgetField::Pids, &self.pids, parse_pids)?,
            api_cost_usd: get(BudgetField::ApiCost, &self.api_cost, parse_api_cost)?,
            cpu_time: get(BudgetField::CpuTime, &self.cpu_time, parse_wall)?,
            evaluation_wall: get(
                BudgetField::EvaluationWall,
                &self.evaluation_wall,
                parse_wall,
            )?,
        };
        o.validate()?;
        Ok(o)
    }
}

/// A positive duration such as "10m".
fn parse_wall(s: &str) -> Result<Duration, String> {
    let d = crate::units::parse_duration(s).map_err(|e| e.to_string())?;
    if d.is_zero() {
        return Err(format!(
            "`{s}` is zero: write a positive duration like 30s, 10m or 1h"
        ));
    }
    Ok(d)
}

/// A positive size such as "1GiB".
fn parse_bytes(s: &str) -> Result<u64, String> {
    match crate::units::parse_size(s) {
        Ok(0) => Err(format!(
            "`{s}` is zero: write a positive size like 512MiB or 2GiB"
        )),
        Ok(n) => Ok(n),
        Err(e) => Err(e.to_string()),
    }
}

/// Percent of one CPU: "200" or "200%" (two CPUs), positive; fractions round.
fn parse_cpu(s: &str) -> Result<u32, String> {
    let t = s.trim();
    let t = t.strip_suffix('%').unwrap_or(t).trim();
    match t.parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 && v <= MAX_CPU_PERCENT as f64 => {
            Ok(v.round().max(1.0) as u32)
        }
        _ => Err(format!(
            "`{s}` is not a CPU share: write a percent of one CPU, like \"50\" or \"200\" (two CPUs), at most {MAX_CPU_PERCENT}"
        )),
    }
}

/// A positive process count.
fn parse_pids(s: &str) -> Result<u64, String> {
    match s.trim().parse::<u64>() {
        Ok(n) if n > 0 => Ok(n),
        _ => Err(format!(
            "`{s}` is not a process count: write a positive integer like 512"
        )),
    }
}

/// US dollars: "5.00", "$5" or "0".
fn parse_api_cost(s: &str) -> Result<f64, String> {
    let t = s.trim();
    let t = t.strip_prefix('$').unwrap_or(t);
    match t.parse::<f64>() {
        Ok(v) if v.is_finite() && v >= 0.0 => Ok(v),
        _ => Err(format!(
            "`{s}` is not an amount: write US dollars like \"5.00\""
        )),
    }
}

/// Accepts a string or a number (kept as its decimal text).
fn human<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    struct V;
    impl Visitor<'_> for V {
        type Value = Option<String>;
        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("a string in human units such as \"10m\" or \"1GiB\", or a number")
        }
        fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
            Ok(Some(v.to_string()))
        }
        fn visit_i64<E: de::Error>(self, v: i64) -> Result<Self::Value, E> {
            Ok(Some(v.to_string()))
        }
        fn visit_u64<E: de::Error>(self, v: u64) -> Result<Self::Value, E> {
            Ok(Some(v.to_string()))
        }
        fn visit_f64<E: de::Error>(self, v: f64) -> Result<Self::Value, E> {
            Ok(Some(v.to_string()))
        }
    }
    d.deserialize_any(V)
}

/// Why an API-cost budget not yet spent counts as exceeded: a call's worst case did not fit.
pub fn api_cost_why(used_usd: f64, limit_usd: f64) -> &'static str {
    if used_usd <= limit_usd {
        " (a model call that could have cost more than was left was refused)"
    } else {
        ""
    }
}

/// A one-line account of a blown budget, e.g. "wall: used 2.0 s of 2.0 s".
pub fn describe(kind: BudgetKind, limits: &Budgets, used: &Usage) -> String {
    use crate::units::format_size;
    match kind {
        BudgetKind::Wall => format!(
            "wall: used {:.1} s of {:.1} s",
            used.wall_s,
            limits.wall.as_secs_f64()
        ),
        BudgetKind::Cpu => format!(
            "cpu: used {:.1} CPU-s of {:.1}",
            used.cpu_s,
            limits.cpu_time.map(|d| d.as_secs_f64()).unwrap_or(0.0)
        ),
        // The cgroup never charges past its limit: a peak above it counts what its netlink
        // sockets held queued, which the supervisor adds (see `NetlinkQueues`).
        BudgetKind::Memory if used.memory_peak_bytes > limits.memory_bytes => format!(
            "memory: peak {} of {} (counting what its netlink sockets held queued)",
            format_size(used.memory_peak_bytes),
            format_size(limits.memory_bytes)
        ),
        // Or, rarer, the supervisor stopped it: its netlink table could not be read, or
        // held more sockets than can be counted at each look (see `NetlinkQueues`).
        BudgetKind::Memory => format!(
            "memory: peak {} of {} (the kernel OOM-killed a process, or the sandbox's netlink sockets could not be counted)",
            format_size(used.memory_peak_bytes),
            format_size(limits.memory_bytes)
        ),
        BudgetKind::Pids => format!(
            "pids: {} of {} (a fork was refused)",
            used.pids_peak, limits.pids
        ),
        BudgetKind::Disk => format!(
            "disk: {} of {} (workspace and /tmp full)",
            format_size(used.disk_bytes),
            format_size(limits.disk_bytes)
        ),
        BudgetKind::ApiCost => format!(
            "api_cost: ${:.4} of ${:.4}{}",
            used.api_cost_usd,
            limits.api_cost_usd,
            api_cost_why(used.api_cost_usd, limits.api_cost_usd)
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(f: impl FnOnce(&mut BudgetText)) -> BudgetText {
        let mut t = BudgetText::default();
        f(&mut t);
        t
    }

    #[test]
    fn overrides_apply() {
        let mut b = Budgets::default();
        let o = text(|t| {
            t.wall = Some("2s".into());
            t.memory = Some("128MiB".into());
            t.pids = Some("64".into());
            t.cpu_time = Some("10m".into());
        })
        .parse()
        .unwrap();
        b.apply(&o).unwrap();
        assert_eq!(b.wall, Duration::from_secs(2));
        assert_eq!(b.memory_bytes, 128 << 20);
        assert_eq!(b.pids, 64);
        assert_eq!(b.cpu_time, Some(Duration::from_secs(600)));
        assert!(text(|t| t.cpu = Some("0".into())).parse().is_err());
    }

    #[test]
    fn every_origin_gets_the_same_checks() {
        // The text route and the typed route (a verdict replayed) refuse alike.
        for (t, field) in [
            (text(|t| t.pids = Some("1".into())), BudgetField::Pids),
            (
                text(|t| t.pids = Some("99999999999".into())),
                BudgetField::Pids,
            ),
            (
                text(|t| t.memory = Some("4MiB".into())),
                BudgetField::Memory,
            ),
            (text(|t| t.disk = Some("1KiB".into())), BudgetField::Disk),
            (text(|t| t.wall = Some("0s".into())), BudgetField::Wall),
            (text(|t| t.cpu = Some("200000".into())), BudgetField::Cpu),
            (
                text(|t| t.api_cost = Some("-1".into())),
                BudgetField::ApiCost,
            ),
        ] {
            assert_eq!(t.parse().unwrap_err().field, field, "{t:?}");
        }
        let mut b = Budgets::default();
        let typed = BudgetOverrides {
            pids: Some(1),
            ..Default::default()
        };
        assert_eq!(b.apply(&typed).unwrap_err().field, BudgetField::Pids);
        let typed = BudgetOverrides {
            memory_bytes: Some(1 << 20),
            ..Default::default()
        };
        assert_eq!(b.apply(&typed).unwrap_err().field, BudgetField::Memory);
        assert_eq!(b, Budgets::default(), "a refused override changes nothing");
    }

    #[test]
    fn human_units_and_numbers() {
        let t: BudgetText = toml::from_str(
            "wall = \"90s\"\nmemory = \"512MiB\"\ncpu = 150\npids = 64\napi_cost = \"$2.50\"\n",
        )
        .unwrap();
        let o = t.parse().unwrap();
        assert_eq!(o.wall, Some(Duration::from_secs(90)));
        assert_eq!(o.cpu_percent, Some(150));
        assert_eq!(o.api_cost_usd, Some(2.5));
        assert_eq!(
            text(|t| t.cpu = Some("50%".into()))
                .parse()
                .unwrap()
                .cpu_percent,
            Some(50)
        );
        let e = toml::from_str::<BudgetText>("wal = \"1h\"\n").unwrap_err();
        assert!(e.to_string().contains("unknown field"), "{e}");
    }

    #[test]
    fn a_budget_round_trips_through_overrides() {
        let b = Budgets {
            cpu_time: Some(Duration::from_secs(30)),
            pids: 77,
            ..Default::default()
        };
        let mut c = Budgets::default();
        c.apply(&b.as_overrides()).unwrap();
        assert_eq!(b, c);
    }
}
