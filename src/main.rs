//! The `fork` binary: parses the command line and dispatches to the library.

#![forbid(unsafe_code)]

use clap::Parser;

fn main() {
    // FORK_TRACE: the phases' clock starts here (see `fork::trace`).
    fork::trace::start();
    fork::cli::default_sigpipe();
    // Until the command knows how to answer them (see `cli::dispatch`).
    fork::cli::hold_interrupts();
    let cli = match fork::cli::Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            // Help and version go to stdout with 0; usage errors are exit 64 (EX_USAGE).
            let code = if e.use_stderr() {
                fork::cli::exit::USAGE
            } else {
                0
            };
            fork::cli::release_interrupts();
            let _ = e.print();
            std::process::exit(code);
        }
    };
    fork::trace::mark("cli: parsed");
    let code = fork::cli::dispatch(cli);
    fork::cli::print_trace();
    std::process::exit(code);
}
