//! `fork gc`: reclaim what crashed runs left behind.

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
        println!(
            "{}",
            serde_json::to_string_pretty(&report)
                .map_err(|e| CliError::from((exit::INTERNAL, e)))?
        );
    } else {
        print!("{}", report.render());
    }
    Ok(if report.errors.is_empty() {
        0
    } else {
        exit::INTERNAL
    })
}
