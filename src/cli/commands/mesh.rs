//! `fork mesh serve|propose|approve`: mesh re-verification over NATS.

use crate::cli::args::print_json;
use crate::cli::exit::{self, CliError};
use crate::mesh::consensus::Quorum;
use crate::mesh::propose::ProposeOptions;
use crate::mesh::serve::ServeOptions;
use crate::mesh::steward::StewardOptions;
use clap::{Args, Subcommand};
use std::path::PathBuf;
use std::time::Duration;

// `fork mesh <serve|propose|approve>`. (Plain comments on the argument types: with their
// arguments built late (`defer`), a doc comment would become their help's about text.)
#[derive(Debug, Subcommand)]
// Each subcommand's arguments are built only when it is the one invoked (or its help is
// asked for): building all of them took 0.2 to 0.3 ms of every start (FORK_TRACE).
#[command(defer = true)]
pub enum MeshCommand {
    /// Be a mesh node: re-verify proposed patches and publish signed verdicts.
    Serve(ServeArgs),
    /// Propose a patch to the mesh and wait for the nodes' consensus.
    Propose(ProposeArgs),
    /// As a steward: approve the nodes' APPROVE verdicts of a reviewed patch, over the mesh.
    Approve(ApproveArgs),
}

// `fork mesh approve`.
#[derive(Debug, Clone, Args)]
pub struct ApproveArgs {
    /// The patch you reviewed: only verdicts about this patch are approved.
    pub patch: PathBuf,
    /// The steward's key (made with `fork keygen --out`).
    #[arg(long)]
    pub key: PathBuf,
    /// A node key (ed25519:<base64>) or file whose verdicts may be approved. Repeatable (or
    /// comma-separated).
    #[arg(
        long,
        allow_hyphen_values = true,
        required = true,
        value_delimiter = ','
    )]
    pub trust: Vec<String>,
    /// The NATS server (JetStream on).
    #[arg(long, default_value = "nats://127.0.0.1:4222")]
    pub nats: String,
    /// The proposal whose verdicts to approve (`fork mesh propose` prints its id); without
    /// it, the first proposal of this patch answered from now on.
    #[arg(long)]
    pub proposal: Option<String>,
    /// How long to wait for the verdicts, e.g. 60s, 10m.
    #[arg(long, default_value = "10m", value_parser = crate::units::parse_duration)]
    pub timeout: Duration,
    /// Where the received bundles and the approvals go (default: ./fork-mesh-approvals).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
    /// Use the staging subjects (fork-staging.*), for experimental schemas.
    #[arg(long)]
    pub staging: bool,
}

// `fork mesh serve`.
#[derive(Debug, Clone, Args)]
pub struct ServeArgs {
    /// The NATS server (JetStream on).
    #[arg(long, default_value = "nats://127.0.0.1:4222")]
    pub nats: String,
    /// The runtime this node evaluates patches for (its root, holding fork.toml).
    #[arg(long, default_value = ".")]
    pub runtime: PathBuf,
    /// Policy file (default: the built-in policies/default.toml).
    #[arg(long)]
    pub policy: Option<PathBuf>,
    /// The node key that endorses this node's verdicts (default:
    /// $XDG_CONFIG_HOME/fork/node.key, created on first use).
    #[arg(long)]
    pub key: Option<PathBuf>,
    /// Use the staging subjects (fork-staging.*), for experimental schemas.
    #[arg(long)]
    pub staging: bool,
    /// Stop after handling N proposals (answered, or refused as invalid).
    #[arg(long, value_name = "N")]
    pub max_proposals: Option<u64>,
    /// Answer the proposals pending now, then stop (a server not reached within 30 s:
    /// exit 69).
    #[arg(long)]
    pub once: bool,
}

#[derive(Debug, Clone, Args)]
pub struct ProposeArgs {
    /// The patch to propose (a unified diff, at most 1 MiB).
    pub patch: PathBuf,
    /// The NATS server (JetStream on).
    #[arg(long, default_value = "nats://127.0.0.1:4222")]
    pub nats: String,
    /// The runtime the patch is for (its root, holding fork.toml: its name goes in the
    /// proposal, and nodes serving another runtime refuse it).
    #[arg(long, default_value = ".")]
    pub runtime: PathBuf,
    /// The task the nodes run (default: the manifest's plan, every `gate = true` task in
    /// file order into one verdict, or the first task when none is marked).
    #[arg(long)]
    pub task: Option<String>,
    /// How long to wait for the verdicts, e.g. 60s, 5m.
    #[arg(long, default_value = "60s", value_parser = crate::units::parse_duration)]
    pub timeout: Duration,
    /// The fraction of the responding trusted nodes that must approve.
    #[arg(long, default_value = "2/3")]
    pub quorum: Quorum,
    /// The absolute floor of approvals, however many nodes answer.
    #[arg(long, default_value_t = 2)]
    pub min_nodes: usize,
    /// A trusted node key (ed25519:<base64>), or a file holding one. Repeatable (or
    /// comma-separated); only these nodes' verdicts count.
    #[arg(
        long,
        allow_hyphen_values = true,
        required = true,
        value_delimiter = ','
    )]
    pub trust: Vec<String>,
    /// A steward key (or file): an approving verdict must carry this steward's approval.
    #[arg(long, allow_hyphen_values = true)]
    pub steward: Option<String>,
    /// Where the received bundles go: OUT/<proposal_id>/<node key id>-<n>/ (default:
    /// ./fork-mesh).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
    /// Use the staging subjects (fork-staging.*), for experimental schemas.
    #[arg(long)]
    pub staging: bool,
}

pub fn mesh_cmd(cmd: MeshCommand) -> Result<i32, CliError> {
    match cmd {
        MeshCommand::Serve(a) => {
            crate::gc::reclaim_on_interrupt(exit::INTERRUPT_GRACE, exit::INTERRUPTED);
            crate::mesh::serve::serve_blocking(ServeOptions {
                nats: a.nats,
                runtime: a.runtime,
                policy: a.policy,
                key: a.key,
                staging: a.staging,
                max_proposals: a.max_proposals,
                once: a.once,
            })?;
            Ok(0)
        }
        MeshCommand::Propose(a) => {
            let json = a.json;
            let report = crate::mesh::propose::propose_blocking(ProposeOptions {
                patch: a.patch,
                nats: a.nats,
                runtime: a.runtime,
                task: a.task,
                timeout: a.timeout,
                quorum: a.quorum,
                min_nodes: a.min_nodes,
                trust: a.trust,
                steward: a.steward,
                out: a.out,
                json: a.json,
                staging: a.staging,
            })?;
            if json {
                print_json(&report)?;
            } else {
                crate::cli::out::lines(report.render())?;
            }
            Ok(if report.consensus.approved { 0 } else { 1 })
        }
        MeshCommand::Approve(a) => {
            let report = crate::mesh::steward::approve_blocking(StewardOptions {
                patch: a.patch,
                key: a.key,
                trust: a.trust,
                nats: a.nats,
                proposal: a.proposal,
                timeout: a.timeout,
                out: a.out,
                staging: a.staging,
            })?;
            if a.json {
                print_json(&report)?;
            } else {
                crate::cli::out::lines(report.render())?;
            }
            Ok(if report.approved.is_empty() { 1 } else { 0 })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::identity::NodeKey;

    #[test]
    fn arguments_parse_like_the_command_line() {
        use clap::Parser;
        #[derive(Parser)]
        struct Cli {
            #[command(flatten)]
            a: ProposeArgs,
        }
        let k1 = NodeKey::generate().public().to_string();
        let k2 = NodeKey::generate().public().to_string();
        let cli = Cli::try_parse_from([
            "x",
            "p.diff",
            "--trust",
            &k1,
            "--trust",
            &k2,
            "--quorum",
            "3/4",
            "--timeout",
            "90s",
            "--min-nodes",
            "3",
        ])
        .unwrap();
        assert_eq!(cli.a.trust, vec![k1.clone(), k2.clone()]);
        assert_eq!(cli.a.quorum, Quorum { num: 3, den: 4 });
        assert_eq!(cli.a.timeout, Duration::from_secs(90));
        assert_eq!(cli.a.min_nodes, 3);
        let cli = Cli::try_parse_from(["x", "p.diff", "--trust", &format!("{k1},{k2}")]).unwrap();
        assert_eq!(cli.a.trust.len(), 2);
        assert_eq!(cli.a.quorum, Quorum { num: 2, den: 3 });
        assert!(
            Cli::try_parse_from(["x", "p.diff"]).is_err(),
            "--trust is required"
        );
        assert!(Cli::try_parse_from(["x", "p.diff", "--trust", &k1, "--quorum", "4/3"]).is_err());
    }
}
