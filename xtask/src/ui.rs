//! Progress a person can follow: a spinner per step on a terminal, plain lines otherwise.

use std::io::IsTerminal;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};

/// The node lab's progress, as the workflows that bring it up or down show it.
pub fn lab_says(what: &str) {
    eprintln!("lab: {what}");
}

/// One step of a workflow: `[n/total] what` with a spinner and the sub-step being done.
pub struct Step {
    bar: ProgressBar,
    label: String,
    started: Instant,
}

impl Step {
    pub fn start(n: usize, total: usize, label: &str) -> Step {
        let label = format!("[{n}/{total}] {label}");
        let bar = if std::io::stderr().is_terminal() {
            let bar = ProgressBar::new_spinner();
            bar.set_style(
                ProgressStyle::with_template("{spinner} {prefix} {wide_msg} {elapsed:>4}")
                    .expect("static template"),
            );
            bar.set_prefix(label.clone());
            bar.enable_steady_tick(Duration::from_millis(100));
            bar
        } else {
            eprintln!("{label} ...");
            ProgressBar::hidden()
        };
        Step {
            bar,
            label,
            started: Instant::now(),
        }
    }

    /// Reports a sub-step (shown beside the spinner, or as a line without a terminal).
    pub fn say(&self, what: &str) {
        if self.bar.is_hidden() {
            eprintln!("      {what}");
        } else {
            self.bar.set_message(what.to_string());
        }
    }

    pub fn done(self, result: &str) {
        self.bar.finish_and_clear();
        eprintln!(
            "{} {result} ({:.1}s)",
            self.label,
            self.started.elapsed().as_secs_f64()
        );
    }
}
