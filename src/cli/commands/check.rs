//! `fork check`: what isolation this host offers, layer by layer.

use crate::cli::args::print_json;
use crate::cli::exit::{self, CliError};
use crate::policy::Policy;
use clap::Args;
use std::path::PathBuf;

#[derive(Debug, Args)]
pub struct CheckArgs {
    /// Policy file (default: the built-in policies/default.toml).
    #[arg(long)]
    pub policy: Option<PathBuf>,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
}

pub fn check(a: CheckArgs) -> Result<i32, CliError> {
    let policy = Policy::load(a.policy.as_deref())?;
    let report = crate::check::check_with_trial(&policy);
    if a.json {
        print_json(&report)?;
    } else {
        crate::cli::out::lines(report.render())?;
    }
    Ok(if report.ok() { 0 } else { exit::UNAVAILABLE })
}
