//! Progress a person can follow in a terminal, and silence when stderr is not one (CI
//! logs, pipes), so machine-read output stays clean.

use std::io::IsTerminal;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressStyle};

pub struct Progress {
    bar: ProgressBar,
}

impl Progress {
    /// A bar of `total` steps labelled `what`; hidden unless stderr is a terminal.
    pub fn new(total: u64, what: &str) -> Progress {
        let bar = if std::io::stderr().is_terminal() {
            let bar = ProgressBar::new(total);
            bar.set_style(
                ProgressStyle::with_template(
                    "{spinner} {prefix} [{bar:30}] {pos}/{len} {wide_msg} {elapsed}",
                )
                .expect("static template")
                .progress_chars("=> "),
            );
            bar.enable_steady_tick(Duration::from_millis(120));
            bar
        } else {
            ProgressBar::hidden()
        };
        bar.set_prefix(what.to_string());
        Progress { bar }
    }

    pub fn inc(&self) {
        self.bar.inc(1);
    }

    pub fn set_message(&self, msg: impl Into<String>) {
        self.bar.set_message(msg.into());
    }

    /// Prints a line without tearing the bar.
    pub fn suspend<R>(&self, f: impl FnOnce() -> R) -> R {
        self.bar.suspend(f)
    }

    pub fn finish(&self) {
        self.bar.finish_and_clear();
    }
}
