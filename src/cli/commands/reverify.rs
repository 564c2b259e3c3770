//! `fork reverify`: re-run the evaluation another node's verdict describes, and say
//! whether the two agree.

use crate::cli::args::parse_keys;
use crate::cli::args::print_json;
use crate::cli::exit::{self, CliError};
use crate::cli::out;
use crate::evaluation::reverify::{reverify, Agreement, MetricAgreement, ReverifyRequest};
use crate::evaluation::Evaluation;
use clap::Args;
use std::path::{Path, PathBuf};

#[derive(Debug, Args)]
pub struct ReverifyArgs {
    /// The verdict to re-verify: a bundle directory or its verdict.json.
    pub verdict: PathBuf,
    /// The patch it is about; its hash must be the verdict's.
    #[arg(long)]
    pub patch: PathBuf,
    /// This node's copy of the runtime (holding fork.toml).
    #[arg(long, default_value = ".")]
    pub runtime: PathBuf,
    /// Policy file for this node's evaluation (default: the built-in policy).
    #[arg(long)]
    pub policy: Option<PathBuf>,
    /// This node's key (default: $XDG_CONFIG_HOME/fork/node.key).
    #[arg(long)]
    pub key: Option<PathBuf>,
    /// Where this node's verdict bundle goes (default: ./fork-out/<run-id>).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Node keys trusted to have endorsed the verdict (default: its own endorser, which
    /// then only proves the bundle is intact, not who made it).
    #[arg(long, allow_hyphen_values = true)]
    pub trust: Vec<String>,
    /// Print the agreement report as JSON.
    #[arg(long)]
    pub json: bool,
}

pub fn reverify_cmd(a: ReverifyArgs) -> Result<i32, CliError> {
    crate::gc::end_on_interrupt(exit::INTERRUPT_GRACE, exit::INTERRUPTED);
    let req = ReverifyRequest {
        verdict: a.verdict.clone(),
        patch: a.patch.clone(),
        runtime: a.runtime.clone(),
        policy: a.policy.clone(),
        key: a.key.clone(),
        out: a.out.clone(),
        trust: parse_keys(&a.trust, "--trust")?,
    };
    let (report, ours) = reverify(&req)?;
    let ours_path = ours.out_dir.join("verdict.json");
    // Our verdict is signed and recorded before the report is printed: stdout that cannot
    // be written (exit 74) says where it is.
    print_report(&report, &ours, &ours_path, a.json).map_err(|e| match e.code {
        exit::IO_ERROR => CliError::new(
            e.code,
            format!(
                "{} (our verdict stands: {})",
                e.message,
                ours_path.display()
            ),
        ),
        _ => e,
    })?;
    Ok(exit::verdict(ours.verdict.verdict))
}

/// The agreement report on stdout: JSON, or text.
fn print_report(
    report: &Agreement,
    ours: &Evaluation,
    ours_path: &Path,
    json: bool,
) -> Result<(), CliError> {
    if json {
        return print_json(report);
    }
    out::line(format!(
        "{}: theirs {} (node {}{}), ours {} (confidence {:.2})",
        if report.agree { "AGREE" } else { "DISAGREE" },
        report.theirs,
        report.their_node,
        if report.their_node_trusted {
            ""
        } else {
            ", not pinned with --trust"
        },
        report.ours,
        ours.verdict.confidence
    ))?;
    for m in &report.metrics {
        out::line(format!(
            "  {:<20} theirs {:<12} ours {:<12} {}",
            m.name,
            m.theirs,
            m.ours
                .map(|o| o.to_string())
                .unwrap_or_else(|| "missing".into()),
            agreement(m)
        ))?;
    }
    out::line(format!("  our verdict: {}", ours_path.display()))
}

/// How one metric's agreement reads: why the two agree, or that they do not, and how far
/// apart they are ("within the noise band" only when they are).
fn agreement(m: &MetricAgreement) -> String {
    let apart = match m.relative_difference {
        Some(d) if d.is_finite() => format!("{:.1}% apart", d * 100.0),
        Some(_) => "incomparable (one is 0)".to_string(),
        None => return "DISAGREE: missing from ours".to_string(),
    };
    match m.agreed {
        Some(why) if m.within_band => format!("agree: {} ({apart})", why.describe()),
        Some(why) => format!(
            "agree: {}; {apart}, beyond its {:.1}% noise band",
            why.describe(),
            m.band * 100.0
        ),
        None => format!(
            "DISAGREE: {apart}, beyond its {:.1}% noise band",
            m.band * 100.0
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::evaluation::reverify::Agreed;

    fn m(diff: Option<f64>, within_band: bool, agreed: Option<Agreed>) -> MetricAgreement {
        MetricAgreement {
            name: "p50_ms".into(),
            theirs: 1.0,
            ours: diff.map(|_| 1.0),
            relative_difference: diff,
            band: 0.01,
            within_band,
            agreed,
        }
    }

    #[test]
    fn never_says_within_the_band_for_values_beyond_it() {
        let beyond = agreement(&m(Some(0.046), false, Some(Agreed::SameConclusion)));
        assert_eq!(
            beyond,
            "agree: the same conclusion (significance and direction); 4.6% apart, beyond its 1.0% noise band"
        );
        assert!(!beyond.contains("within"));
        assert_eq!(
            agreement(&m(Some(0.004), true, Some(Agreed::WithinBand))),
            "agree: within the noise band (0.4% apart)"
        );
        assert_eq!(
            agreement(&m(Some(0.046), false, None)),
            "DISAGREE: 4.6% apart, beyond its 1.0% noise band"
        );
        assert_eq!(
            agreement(&m(None, false, None)),
            "DISAGREE: missing from ours"
        );
    }
}
