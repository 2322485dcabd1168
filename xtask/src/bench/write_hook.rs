//! What capturing the CNI plugins' output cost an observed arm (benchmark 12), from the
//! observer's own trace: the write hook is attached only while a plugin runs, so its cost
//! to the node is the time it was attached (every write(2) on the node passes it then)
//! and how often it was attached. Each attach, detach and refusal is a `cni_write_hook`
//! kernel record; a plugin run is its `cni_exec` to its process's exit.

use std::path::Path;

use anyhow::Context;
use serde_json::Value;

/// The write hook over one observed arm.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct HookWindows {
    pub attaches: u64,
    /// Milliseconds the hook was attached in all.
    pub attached_ms: f64,
    /// The trace's span, from its header to its footer, in ms.
    pub trace_ms: f64,
    /// Attached windows in which no CNI plugin ran.
    pub idle_windows: u64,
    /// Plugin runs whose exec came while the hook was not attached.
    pub missed_runs: u64,
    pub plugin_runs: u64,
}

/// Reads an observed trace's write-hook windows and plugin runs.
pub fn from_trace(path: &Path) -> anyhow::Result<HookWindows> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    Ok(windows(
        text.lines().filter_map(|l| serde_json::from_str(l).ok()),
    ))
}

fn windows(records: impl Iterator<Item = Value>) -> HookWindows {
    let (mut start, mut end) = (None, None);
    let mut changes: Vec<(u64, bool)> = Vec::new();
    let mut execs: Vec<(u64, u64)> = Vec::new();
    let mut exits: Vec<(u64, u64)> = Vec::new();
    for r in records {
        let t = r["ktime_ns"].as_u64();
        match (r["type"].as_str(), r["kind"].as_str()) {
            (Some("header"), _) => start = r["started_ns"].as_u64(),
            (Some("footer"), _) => end = r["ended_ns"].as_u64(),
            (Some("kernel"), Some("cni_write_hook")) => {
                if let (Some(t), Some(change)) = (t, r["change"].as_str()) {
                    match change {
                        "attached" => changes.push((t, true)),
                        "detached" => changes.push((t, false)),
                        _ => {}
                    }
                }
            }
            (Some("kernel"), Some("cni_exec")) => {
                if let (Some(t), Some(pid)) = (t, r["tgid"].as_u64()) {
                    execs.push((t, pid));
                }
            }
            (Some("kernel"), Some("exit")) => {
                if let (Some(t), Some(pid)) = (t, r["tgid"].as_u64()) {
                    exits.push((t, pid));
                }
            }
            _ => {}
        }
    }
    changes.sort_by_key(|c| c.0);
    let end_ns = end.unwrap_or_else(|| changes.last().map_or(0, |c| c.0));
    // The attached windows: each attach to the next detach (or the trace's end).
    let mut spans: Vec<(u64, u64)> = Vec::new();
    let mut open: Option<u64> = None;
    for (t, attached) in &changes {
        match (attached, open) {
            (true, None) => open = Some(*t),
            (false, Some(a)) => {
                spans.push((a, *t));
                open = None;
            }
            _ => {}
        }
    }
    if let Some(a) = open {
        spans.push((a, end_ns.max(a)));
    }
    let run_end = |t: u64, pid: u64| {
        exits
            .iter()
            .find(|(e, p)| *p == pid && *e >= t)
            .map_or(t, |e| e.0)
    };
    let runs: Vec<(u64, u64)> = execs
        .iter()
        .map(|(t, pid)| (*t, run_end(*t, *pid)))
        .collect();
    let inside = |t: u64| spans.iter().any(|(a, b)| *a <= t && t <= *b);
    HookWindows {
        attaches: changes.iter().filter(|c| c.1).count() as u64,
        attached_ms: spans.iter().map(|(a, b)| (b - a) as f64 / 1e6).sum(),
        trace_ms: start.map_or(0.0, |s| end_ns.saturating_sub(s) as f64 / 1e6),
        idle_windows: spans
            .iter()
            .filter(|(a, b)| !runs.iter().any(|(s, e)| s <= b && e >= a))
            .count() as u64,
        missed_runs: runs.iter().filter(|(s, _)| !inside(*s)).count() as u64,
        plugin_runs: runs.len() as u64,
    }
}

impl HookWindows {
    /// Adds another arm's.
    pub fn add(&mut self, o: &HookWindows) {
        self.attaches += o.attaches;
        self.attached_ms += o.attached_ms;
        self.trace_ms += o.trace_ms;
        self.idle_windows += o.idle_windows;
        self.missed_runs += o.missed_runs;
        self.plugin_runs += o.plugin_runs;
    }

    pub fn text(&self) -> String {
        format!(
            "attached {:.0} ms of {:.0} ms observed ({:.2}%), {} attaches for {} plugin runs; \
             {} attached windows with no plugin running; {} plugin runs exec'd before the \
             hook was attached",
            self.attached_ms,
            self.trace_ms,
            if self.trace_ms > 0.0 {
                100.0 * self.attached_ms / self.trace_ms
            } else {
                0.0
            },
            self.attaches,
            self.plugin_runs,
            self.idle_windows,
            self.missed_runs
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn windows_are_attach_to_detach_and_each_plugin_run_is_placed_in_one() {
        let ms = 1_000_000u64;
        let records = vec![
            json!({"type": "header", "started_ns": 0}),
            json!({"type": "kernel", "kind": "cni_write_hook", "ktime_ns": 100 * ms, "change": "attached"}),
            json!({"type": "kernel", "kind": "cni_exec", "ktime_ns": 101 * ms, "tgid": 7}),
            json!({"type": "kernel", "kind": "exit", "ktime_ns": 150 * ms, "tgid": 7}),
            json!({"type": "kernel", "kind": "cni_write_hook", "ktime_ns": 700 * ms, "change": "detached"}),
            // Exec'd before the next attach: its output could not be seen.
            json!({"type": "kernel", "kind": "cni_exec", "ktime_ns": 800 * ms, "tgid": 8}),
            json!({"type": "kernel", "kind": "cni_write_hook", "ktime_ns": 805 * ms, "change": "attached"}),
            json!({"type": "kernel", "kind": "exit", "ktime_ns": 810 * ms, "tgid": 8}),
            json!({"type": "kernel", "kind": "cni_write_hook", "ktime_ns": 900 * ms, "change": "detached"}),
            // Attached with no plugin at all.
            json!({"type": "kernel", "kind": "cni_write_hook", "ktime_ns": 950 * ms, "change": "attached"}),
            json!({"type": "footer", "ended_ns": 1000 * ms}),
        ];
        let w = windows(records.into_iter());
        assert_eq!(w.attaches, 3);
        assert!(
            (w.attached_ms - (600.0 + 95.0 + 50.0)).abs() < 1e-9,
            "{w:?}"
        );
        assert_eq!(
            (w.plugin_runs, w.missed_runs, w.idle_windows),
            (2, 1, 1),
            "{w:?}"
        );
        assert_eq!(w.trace_ms, 1000.0);
        assert!(
            w.text().starts_with(
                "attached 745 ms of 1000 ms observed (74.50%), 3 attaches for 2 plugin runs"
            ),
            "{}",
            w.text()
        );
    }
}
