//! Progress for commands that can take more than a couple of seconds (`plan` on huge graphs, `run --check`,
//! `pack --budget-ms`): an indicatif bar or spinner on standard error, drawn only when standard error is a
//! terminal and progress is enabled (main turns it off when `-v` or `RUST_LOG` asks for log lines, which a bar
//! would garble); hidden otherwise, so scripts and CI logs never see it. A hidden bar costs next to nothing.
//!
//! ```ignore
//! let p = Progress::bar(n, "checking");
//! for _ in 0..n { work(); p.inc(1); }
//! p.finish(); // or drop it: the line is cleared either way
//! ```

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::borrow::Cow;
use std::io::IsTerminal;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

static ENABLED: AtomicBool = AtomicBool::new(true);

/// Allow or forbid drawing for the rest of the process (main: off when logging is verbose).
pub fn set_enabled(on: bool) {
    ENABLED.store(on, Ordering::Relaxed);
}

/// True when a new progress indicator would be drawn: enabled, and standard error is a terminal.
pub fn visible() -> bool {
    ENABLED.load(Ordering::Relaxed) && std::io::stderr().is_terminal()
}

/// A progress bar or spinner on standard error; cleared when finished or dropped.
#[derive(Debug)]
pub struct Progress {
    bar: ProgressBar,
}

impl Progress {
    fn with(bar: ProgressBar, style: Result<ProgressStyle, indicatif::style::TemplateError>, what: &str) -> Self {
        if visible() {
            bar.set_draw_target(ProgressDrawTarget::stderr());
            if let Ok(style) = style {
                bar.set_style(style);
            }
            bar.enable_steady_tick(Duration::from_millis(120));
        } else {
            bar.set_draw_target(ProgressDrawTarget::hidden());
        }
        bar.set_message(what.to_string());
        Progress { bar }
    }

    /// A bar of `len` units of work described by `what`.
    pub fn bar(len: u64, what: &str) -> Self {
        Self::with(
            ProgressBar::with_draw_target(Some(len), ProgressDrawTarget::hidden()),
            ProgressStyle::with_template(
                "{spinner} {msg} [{elapsed_precise}] {wide_bar} {human_pos}/{human_len} ({eta})",
            ),
            what,
        )
    }

    /// A spinner for work of unknown length, showing `what` and the time elapsed.
    pub fn spinner(what: &str) -> Self {
        Self::with(
            ProgressBar::with_draw_target(None, ProgressDrawTarget::hidden()),
            ProgressStyle::with_template("{spinner} {msg} [{elapsed_precise}]"),
            what,
        )
    }

    /// Describe the current stage (`"planning"`, `"packing: best 4.2 MiB"`).
    pub fn set_message(&self, msg: impl Into<Cow<'static, str>>) {
        self.bar.set_message(msg);
    }

    /// Advance by `n` units.
    pub fn inc(&self, n: u64) {
        self.bar.inc(n);
    }

    /// Set the position.
    pub fn set_position(&self, pos: u64) {
        self.bar.set_position(pos);
    }

    /// Change the total (for work whose size becomes known late).
    pub fn set_length(&self, len: u64) {
        self.bar.set_length(len);
    }

    /// Units done so far.
    pub fn position(&self) -> u64 {
        self.bar.position()
    }

    /// True when nothing is drawn.
    pub fn is_hidden(&self) -> bool {
        self.bar.is_hidden()
    }

    /// Run `f` with the bar taken off the screen (for printing a line to stderr while it runs).
    pub fn suspend<R>(&self, f: impl FnOnce() -> R) -> R {
        self.bar.suspend(f)
    }

    /// Stop and clear the line.
    pub fn finish(self) {
        self.bar.finish_and_clear();
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        if !self.bar.is_finished() {
            self.bar.finish_and_clear();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hidden_without_a_terminal_or_when_disabled_and_still_counts() {
        // Test harnesses capture stderr, and the flag forbids drawing anyway.
        set_enabled(false);
        assert!(!visible());
        let p = Progress::bar(10, "work");
        assert!(p.is_hidden());
        p.inc(3);
        p.set_position(7);
        p.inc(1);
        assert_eq!(p.position(), 8);
        p.set_length(20);
        assert_eq!(p.suspend(|| 5), 5);
        p.finish();
        let s = Progress::spinner("spin");
        s.set_message("stage two");
        assert!(s.is_hidden());
        drop(s);
    }
}
