//! A long command's progress on stderr: one line rewritten in place on a
//! terminal, one line per update when asked (`--progress`) otherwise, and
//! nothing when stderr is not a terminal and no one asked. stdout stays
//! the result's alone (tables or `--json`).
//!
//! Our own few lines rather than a progress-bar crate: one line of text is
//! all `prune` and `reconcile` show, and it must never reach stdout.

use std::io::{IsTerminal, Write};
use std::sync::Mutex;

/// Where a command's progress goes.
pub(crate) struct ProgressLine {
    terminal: bool,
    shown: bool,
    /// Whether a line is on the terminal unfinished (to end it at the end).
    drawn: Mutex<bool>,
}

impl ProgressLine {
    /// Shown on a terminal, or anywhere when `forced`.
    pub fn new(forced: bool) -> Self {
        let terminal = std::io::stderr().is_terminal();
        Self {
            terminal,
            shown: terminal || forced,
            drawn: Mutex::new(false),
        }
    }

    /// Show `line` (made safe for a terminal first).
    pub fn show(&self, line: &str) {
        if !self.shown {
            return;
        }
        let line = super::printable::line(line);
        let mut stderr = std::io::stderr().lock();
        let _ = if self.terminal {
            write!(stderr, "\r{line}\x1b[K")
        } else {
            writeln!(stderr, "{line}")
        };
        let _ = stderr.flush();
        if let Ok(mut drawn) = self.drawn.lock() {
            *drawn = self.terminal;
        }
    }

    /// End the line in place, so what follows starts on its own.
    pub fn finish(&self) {
        if self.drawn.lock().is_ok_and(|drawn| *drawn) {
            eprintln!();
        }
    }
}
