//! How the command line shows logs and the library's progress events on stderr.
//!
//! * Progress ([`crate::evaluation::progress::TARGET`]) is always shown: on a terminal a
//!   run in progress is one live line, rewritten in place and replaced by its result;
//!   otherwise every event is a plain line of its own (`fork: ...`).
//! * Logs go through `FORK_LOG`, else `RUST_LOG`, else `-v` (info) / `-vv` (debug), else
//!   warnings only.
//! * Colour only when stderr is a terminal and `NO_COLOR` is unset (or empty).

use crate::evaluation::progress::TARGET;
use std::io::{IsTerminal as _, Write as _};
use std::sync::Mutex;
use tracing::field::{Field, Visit};
use tracing::{Event, Subscriber};
use tracing_subscriber::layer::{Context, SubscriberExt as _};
use tracing_subscriber::util::SubscriberInitExt as _;
use tracing_subscriber::{filter, EnvFilter, Layer};

/// Whether colour may be written to a stream that is (or is not) a terminal, given
/// `NO_COLOR` (<https://no-color.org>: set and not empty disables colour).
pub fn colour_allowed(is_terminal: bool, no_color: Option<&std::ffi::OsStr>) -> bool {
    is_terminal && no_color.is_none_or(|v| v.is_empty())
}

/// The log filter: `FORK_LOG`, else `RUST_LOG`, else the `-v` level. Progress events are
/// never logs (they have their own layer).
fn log_filter(verbose: u8) -> EnvFilter {
    let level = match verbose {
        0 => "warn",
        1 => "info",
        _ => "debug",
    };
    let from = |var: &str| {
        std::env::var(var)
            .ok()
            .filter(|v| !v.trim().is_empty())
            .and_then(|v| EnvFilter::try_new(v).ok())
    };
    let f = from("FORK_LOG")
        .or_else(|| from("RUST_LOG"))
        .unwrap_or_else(|| EnvFilter::new(level));
    match format!("{TARGET}=off").parse() {
        Ok(d) => f.add_directive(d),
        Err(_) => f,
    }
}

/// Installs the stderr subscriber: logs, and progress lines.
pub fn init(verbose: u8) {
    let stderr = std::io::stderr();
    let tty = stderr.is_terminal();
    let colour = colour_allowed(tty, std::env::var_os("NO_COLOR").as_deref());
    let logs = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(colour)
        .without_time()
        .with_filter(log_filter(verbose));
    let progress = ProgressLayer {
        tty,
        colour,
        live: Mutex::new(false),
    }
    .with_filter(filter::filter_fn(|m| m.target() == TARGET));
    let _ = tracing_subscriber::registry()
        .with(logs)
        .with(progress)
        .try_init();
}

/// What a progress event says.
#[derive(Default)]
struct Fields {
    message: String,
    kind: String,
    ok: Option<bool>,
}

impl Visit for Fields {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "kind" {
            self.kind = value.to_string();
        }
    }
    fn record_bool(&mut self, field: &Field, value: bool) {
        if field.name() == "ok" {
            self.ok = Some(value);
        }
    }
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            self.message = format!("{value:?}");
        }
    }
}

struct ProgressLayer {
    tty: bool,
    colour: bool,
    /// A live line is on screen (a terminal only).
    live: Mutex<bool>,
}

const BOLD: &str = "\x1b[1m";
const GREEN: &str = "\x1b[32m";
const RED: &str = "\x1b[31m";
const DIM: &str = "\x1b[2m";
const RESET: &str = "\x1b[0m";
/// Back to the line's start, and clear it.
const CLEAR_LINE: &str = "\r\x1b[2K";

impl ProgressLayer {
    fn paint(&self, style: &str, text: &str) -> String {
        if self.colour {
            format!("{style}{text}{RESET}")
        } else {
            text.to_string()
        }
    }

    /// The line for one event, and whether it stays (a run in progress is live).
    fn render(&self, f: &Fields) -> (String, bool) {
        let text = f
            .message
            .chars()
            .filter(|c| !c.is_control())
            .collect::<String>();
        match f.kind.as_str() {
            "phase" => (format!("fork: {}", self.paint(BOLD, &text)), true),
            "run_start" => (format!("fork: {}", self.paint(DIM, &text)), !self.tty),
            _ => {
                let style = if f.ok == Some(false) { RED } else { GREEN };
                (format!("fork: {}", self.paint(style, &text)), true)
            }
        }
    }
}

impl<S: Subscriber> Layer<S> for ProgressLayer {
    fn on_event(&self, event: &Event<'_>, _: Context<'_, S>) {
        let mut f = Fields::default();
        event.record(&mut f);
        let (line, stays) = self.render(&f);
        let mut live = self.live.lock().unwrap_or_else(|e| e.into_inner());
        let mut err = std::io::stderr().lock();
        let clear = if self.tty && *live { CLEAR_LINE } else { "" };
        let end = if stays { "\n" } else { "" };
        // Progress is best effort: a closed stderr never stops an evaluation.
        let _ = write!(err, "{clear}{line}{end}");
        let _ = err.flush();
        *live = !stays;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::OsStr;

    #[test]
    fn colour_only_on_a_terminal_and_never_with_no_color() {
        assert!(colour_allowed(true, None));
        assert!(colour_allowed(true, Some(OsStr::new(""))));
        assert!(!colour_allowed(true, Some(OsStr::new("1"))));
        assert!(!colour_allowed(false, None));
    }

    #[test]
    fn a_run_in_progress_is_live_only_on_a_terminal() {
        let start = Fields {
            message: "run task t, patched: running".into(),
            kind: "run_start".into(),
            ok: None,
        };
        let plain = ProgressLayer {
            tty: false,
            colour: false,
            live: Mutex::new(false),
        };
        assert_eq!(
            plain.render(&start),
            ("fork: run task t, patched: running".to_string(), true)
        );
        let tty = ProgressLayer {
            tty: true,
            colour: true,
            live: Mutex::new(false),
        };
        let (line, stays) = tty.render(&start);
        assert!(!stays && line.contains(DIM), "{line}");
    }
}
