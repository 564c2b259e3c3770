//! What a run left behind, read after it is dead: the declared results and metrics (the
//! evidence), any other report files and the output log (artifacts). Everything is read
//! beneath the capped disk's root (which the successor could not replace) through
//! `task::results::read_report_file`, never following a link: the successor may have
//! replaced its workspace or reports directory with one.

use super::plan::Plan;
use super::redact::Redactor;
use super::{internal, EvaluateError};
use crate::sandbox::Outcome;
use crate::task::results;
use crate::verdict::ArtifactType;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Undeclared files in the reports directory kept as artifacts, at most.
const MAX_EXTRA_REPORTS: usize = 32;
/// Bytes of undeclared report files kept per run, in all (what does not fit is left out).
const MAX_EXTRA_REPORT_BYTES: u64 = 16 << 20;

/// What one run of the task (after its reruns) produced.
pub struct RunResult {
    pub outcome: Outcome,
    /// The run was ended by the evaluation's own wall budget (its per-run wall had been
    /// lowered to what the evaluation had left).
    pub over_evaluation_wall: bool,
    pub tests: Option<results::TestReport>,
    pub results_error: Option<String>,
    pub metrics: Option<std::collections::BTreeMap<String, f64>>,
    pub metrics_error: Option<String>,
    /// Copies of the report files and the output log, in the staging directory.
    pub artifacts: Vec<(ArtifactType, PathBuf)>,
    /// What fork could not do with what the successor left (a rerun it could not prepare),
    /// for the verdict's caveats.
    pub notes: Vec<String>,
    /// How the protected tree differed from the parent's after the run (see `protect`).
    pub protected_changes: Vec<crate::verdict::decide::ProtectedChange>,
}

impl RunResult {
    /// What a side's runs left, as evidence: every name and message in it redacted. Metric
    /// names that would become one are refused as a metrics error (`metrics_path`: the
    /// task's declared metrics file, named in it).
    pub fn redact(&mut self, red: &Redactor, metrics_path: &str) {
        let r = self;
        if red.is_empty() {
            return;
        }
        if let Some(t) = r.tests.as_mut() {
            for c in &mut t.cases {
                c.name = red.text(&c.name);
                // As the parser keeps it: only while the name still starts with it.
                c.classname = c
                    .classname
                    .take()
                    .map(|cn| red.text(&cn))
                    .filter(|cn| c.name.starts_with(&format!("{cn}.")));
                c.message = c.message.take().map(|m| red.text(&m));
            }
        }
        for e in [
            &mut r.results_error,
            &mut r.metrics_error,
            &mut r.outcome.exec_error,
        ] {
            if let Some(s) = e.as_mut() {
                *s = red.text(s);
            }
        }
        if let Some(m) = r.metrics.take() {
            match red.metric_names(m) {
                Ok(m) => r.metrics = Some(m),
                Err(name) => {
                    r.metrics_error = Some(format!(
                        "{metrics_path}: two metric names read `{name}` once the values the policy passes into the sandbox are redacted, and fork cannot tell them apart; name metrics without those values"
                    ))
                }
            }
        }
        for n in &mut r.notes {
            *n = red.text(n);
        }
        for c in &mut r.protected_changes {
            c.path = red.text(&c.path);
        }
    }
}

/// Longest staged artifact name kept from a name the successor chose (well below NAME_MAX,
/// with room for the side and retry prefixes).
const MAX_STAGED_NAME: usize = 96;

/// A staging file name for a report file the successor named: only `[A-Za-z0-9._-]` (as
/// the bundle names artifacts), at most [`MAX_STAGED_NAME`] bytes (a longer name is cut and
/// keeps a digest of the whole, so two long names stay apart). A name that holds one of
/// the run's secrets becomes `report-redacted` (the stager numbers a second one): neither
/// the name nor a digest of it is kept.
fn staged_report_name(name: &str, redactor: &Redactor) -> String {
    if redactor.appears_in(name) {
        return "report-redacted".into();
    }
    let safe = crate::verdict::bundle::sanitize_name(name);
    let full = format!("report-{safe}");
    if full.len() <= MAX_STAGED_NAME {
        return full;
    }
    let digest = &super::sha256_hex(name.as_bytes())[..16];
    format!("{}-{digest}", &full[..MAX_STAGED_NAME - 17])
}

/// Where a run's artifacts are staged: `<dir>/<prefix><name>`.
pub struct Stager<'a> {
    pub dir: &'a Path,
    pub prefix: &'a str,
}

impl Stager<'_> {
    /// Stages `bytes` under a name of fork's: unique (a clash gets a counter), never
    /// overwriting an earlier artifact.
    pub fn put(&self, name: &str, bytes: &[u8]) -> Result<PathBuf, EvaluateError> {
        let mut dest = self.dir.join(format!("{}{name}", self.prefix));
        let mut n = 1;
        while std::fs::symlink_metadata(&dest).is_ok() {
            n += 1;
            dest = self.dir.join(format!("{}{n}-{name}", self.prefix));
        }
        std::fs::write(&dest, bytes).map_err(|e| internal("staging")(e.to_string()))?;
        Ok(dest)
    }
}

/// Whether the run's declared reports are evidence (read and parsed) or only artifacts
/// (a judged subject's own reports: kept, never believed).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reading {
    Evidence,
    ArtifactsOnly,
}

/// What was read.
pub struct Collected {
    pub tests: Option<results::TestReport>,
    pub results_error: Option<String>,
    pub metrics: Option<BTreeMap<String, f64>>,
    pub metrics_error: Option<String>,
    pub artifacts: Vec<(ArtifactType, PathBuf)>,
}

/// Reads what a run left on `disk` (its capped filesystem) and its output `log` (through
/// the descriptor fork opened, the path may have been replaced).
pub fn collect(
    p: &Plan,
    task: &crate::manifest::TaskSpec,
    disk: &Path,
    log: &std::fs::File,
    stage: &Stager<'_>,
    reading: Reading,
) -> Result<Collected, EvaluateError> {
    let in_reports = |rel: &str| format!("successor/reports/{rel}");
    // What the policy passed in (tokens, credentials) never reaches the bundle (the
    // evidence parsed here is redacted as it leaves `run_side`).
    let stage = |name: String, bytes: &[u8]| stage.put(&name, &p.redactor.bytes(bytes));
    let mut artifacts = Vec::new();
    let mut tests = None;
    let mut results_error = None;
    let evidence = reading == Reading::Evidence;
    // `exit_status` without a path declares no report: the exit status is the result.
    let declared_report = task
        .results
        .as_ref()
        .filter(|_| evidence)
        .and_then(|r| Some((r.format, r.path.as_ref()?)));
    if let Some((format, path)) = declared_report {
        match results::read_report_file(disk, &in_reports(path), results::DEFAULT_MAX_REPORT_BYTES)
        {
            Ok(bytes) => {
                match results::parse_report(format, &bytes) {
                    Ok(t) => tests = Some(t),
                    Err(e) => results_error = Some(format!("{path}: {e}")),
                }
                let name = Path::new(path)
                    .file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_else(|| "results".into());
                artifacts.push((ArtifactType::TestReport, stage(name, &bytes)?));
            }
            Err(e) => results_error = Some(format!("{path}: {e}")),
        }
    }
    let mut metrics = None;
    let mut metrics_error = None;
    if let Some(m) = task.metrics.as_ref().filter(|_| evidence) {
        match results::read_report_file(disk, &in_reports(m), results::DEFAULT_MAX_REPORT_BYTES) {
            Ok(bytes) => {
                match results::parse_metrics(&bytes) {
                    Ok(v) => metrics = Some(v),
                    Err(e) => metrics_error = Some(format!("{m}: {e}")),
                }
                artifacts.push((ArtifactType::Metrics, stage("metrics.json".into(), &bytes)?));
            }
            Err(e) => metrics_error = Some(format!("{m}: {e}")),
        }
    }
    // Any other report files (top level, regular, bounded in count and size) travel too.
    let declared: Vec<&str> = task
        .results
        .iter()
        .filter_map(|r| r.path.as_deref())
        .chain(task.metrics.as_deref())
        .filter(|_| evidence)
        .collect();
    let reports_dir = disk.join("successor/reports");
    let reports_intact = ["successor", "successor/reports"].iter().all(|c| {
        std::fs::symlink_metadata(disk.join(c))
            .map(|m| m.is_dir())
            .unwrap_or(false)
    });
    if reports_intact {
        if let Ok(rd) = std::fs::read_dir(&reports_dir) {
            let mut names: Vec<String> = rd
                .flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| !declared.contains(&n.as_str()))
                .collect();
            names.sort();
            let mut room = MAX_EXTRA_REPORT_BYTES;
            for name in names.into_iter().take(MAX_EXTRA_REPORTS) {
                // read_report_file refuses symlinks, non-regular and oversized files; what
                // the successor left is bounded in count and in total size on the host.
                if room == 0 {
                    break;
                }
                if let Ok(bytes) = results::read_report_file(disk, &in_reports(&name), room) {
                    room = room.saturating_sub(bytes.len() as u64);
                    let dest = stage(staged_report_name(&name, &p.redactor), &bytes)?;
                    artifacts.push((ArtifactType::Other, dest));
                }
            }
        }
    }
    // The output log, through the fd we opened (the successor may have replaced the path).
    {
        use std::io::{Read, Seek};
        let mut f = log;
        let mut buf = Vec::new();
        if f.rewind().is_ok() {
            let _ = f.take(4 << 20).read_to_end(&mut buf);
        }
        artifacts.push((ArtifactType::Log, stage("output.log".into(), &buf)?));
    }
    Ok(Collected {
        tests,
        results_error,
        metrics,
        metrics_error,
        artifacts,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_report_name_holding_a_secret_is_replaced_whole() {
        let r = Redactor::new(["sk-live-0123"]);
        assert_eq!(staged_report_name("a.json", &r), "report-a.json");
        for name in [
            "report-sk-live-0123",
            &format!("{}sk-live-0123", "x".repeat(200)),
            "sk live sk-live-0123.txt",
        ] {
            assert_eq!(staged_report_name(name, &r), "report-redacted", "{name}");
        }
    }
}
