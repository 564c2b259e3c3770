//! `fork-init`: the sandbox init (pid 1 of each sandbox), a binary of its own so that each
//! launch executes a small program instead of re-executing the whole `fork` binary. The
//! supervisor starts it (`fork-init __sandbox-init CFG_FD STATUS_FD`) from beside the `fork`
//! binary, after checking that it carries the same build id; see `fork::sandbox::init_exe`.

#![forbid(unsafe_code)]

fn main() {
    let args: Vec<String> = std::env::args().collect();
    match args.get(1).map(String::as_str) {
        Some(role) if role == fork::sandbox::INIT_ROLE => {
            std::process::exit(fork::sandbox::init::main(&args[2..]))
        }
        Some("--build-id") => {
            // The supervisor looks for this line in the file before it runs it.
            print!("{}", fork::sandbox::init_exe::BUILD_MARK);
        }
        _ => {
            eprintln!(
                "fork-init: the sandbox init; fork starts it itself ({})",
                fork::sandbox::init_exe::BUILD_MARK.trim_end()
            );
            std::process::exit(fork::sandbox::init::code::NOT_BY_FORK);
        }
    }
}
