//! `fork gc`: reclaim what crashed runs left behind.

use crate::cli::args::print_json;
use crate::cli::exit::{self, CliError};
use clap::Args;

#[derive(Debug, Args)]
pub struct GcArgs {
    /// Print what was reclaimed as JSON.
    #[arg(long)]
    pub json: bool,
}

pub fn gc(a: GcArgs) -> Result<i32, CliError> {
    let report = crate::gc::collect();
    if a.json {
        print_json(&report)?;
    } else {
        crate::cli::out::lines(report.render())?;
    }
    Ok(if report.errors.is_empty() {
        0
    } else {
        exit::INTERNAL
    })
}
