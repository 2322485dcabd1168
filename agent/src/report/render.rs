//! The report as text: a terminal table, or markdown for a pull request or a wiki page.
//! Times print in milliseconds with three decimals (the recorded nanoseconds, rounded
//! only for display), shares with one.

use std::fmt::Write as _;

use super::{PodReport, Report};

fn ms(ns: u64) -> String {
    format!("{:.3}", ns as f64 / 1e6)
}

fn header(r: &Report) -> String {
    let ran = r.pods.iter().filter(|p| p.breakdown.is_some()).count();
    format!(
        "{} trace{}, {} pod{} ({ran} reached Running)",
        r.traces.len(),
        if r.traces.len() == 1 { "" } else { "s" },
        r.pods.len(),
        if r.pods.len() == 1 { "" } else { "s" },
    )
}

fn pod_title(p: &PodReport) -> String {
    match &p.breakdown {
        Some(b) => format!(
            "{} ({})  startup {} ms, pod_seen -> {}",
            p.display_name(),
            p.trace,
            ms(b.total_ns),
            b.end
        ),
        None => format!(
            "{} ({})  {}",
            p.display_name(),
            p.trace,
            p.outcome.as_deref().unwrap_or("")
        ),
    }
}

/// The terminal table: the stage statistics, then each pod's breakdown.
pub fn table(r: &Report) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "{}\n", header(r));
    let w = r
        .stages
        .iter()
        .map(|s| s.stage.len())
        .max()
        .unwrap_or(5)
        .max(5);
    let _ = writeln!(
        out,
        "{:<w$}  {:>5}  {:>6}  {:>10}  {:>10}  {:>10}  {:>10}",
        "STAGE", "COUNT", "FAILED", "P50 ms", "P90 ms", "P99 ms", "MAX ms"
    );
    for s in &r.stages {
        let _ = writeln!(
            out,
            "{:<w$}  {:>5}  {:>6}  {:>10}  {:>10}  {:>10}  {:>10}",
            s.stage,
            s.count,
            s.failed,
            ms(s.p50_ns),
            ms(s.p90_ns),
            ms(s.p99_ns),
            ms(s.max_ns)
        );
    }
    for p in &r.pods {
        let _ = writeln!(out, "\n{}", pod_title(p));
        let _ = writeln!(out, "  sources: {}", sources_line(p));
        let Some(b) = &p.breakdown else {
            continue;
        };
        let w = b
            .parts
            .iter()
            .map(|x| x.part.len())
            .max()
            .unwrap_or(4)
            .max(5);
        let _ = writeln!(out, "  {:<w$}  {:>10}  {:>6}  WHAT", "PART", "MS", "SHARE");
        for x in &b.parts {
            let _ = writeln!(
                out,
                "  {:<w$}  {:>10}  {:>5.1}%  {}",
                x.part,
                ms(x.ns),
                x.share,
                x.what
            );
        }
        let _ = writeln!(
            out,
            "  {:<w$}  {:>10}  {:>5.1}%",
            "total",
            ms(b.total_ns),
            100.0
        );
        let _ = writeln!(out, "  {}", what_is_left(b));
        for n in &b.notes {
            let _ = writeln!(out, "  note: {n}");
        }
    }
    out
}

/// The pod's sources, with the reason for each that is not wholly there.
fn sources_line(p: &PodReport) -> String {
    let Some(sources) = &p.sources else {
        return "not recorded (a trace from before podlapse recorded them)".to_string();
    };
    let mut line = sources.line();
    for (name, state) in sources.lacking() {
        if let Some(why) = state.why() {
            let _ = write!(line, "; {name}: {why}");
        }
    }
    line
}

/// One line: the largest opaque part and the gap, the time the stages leave unexplained.
fn what_is_left(b: &super::Breakdown) -> String {
    let opaque = match b.largest_opaque() {
        Some(p) => format!("largest opaque part {} {:.1}%", p.part, p.share),
        None => "no opaque part".to_string(),
    };
    let gap = b.gap().map_or(0.0, |g| g.share);
    format!("{opaque}; gap {gap:.1}%")
}

/// The same report as markdown tables.
pub fn markdown(r: &Report) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "# podlapse report\n\n{}: {}\n",
        header(r),
        r.traces.join(", ")
    );
    let _ = writeln!(out, "## Stages\n");
    let _ = writeln!(
        out,
        "| stage | count | failed | p50 ms | p90 ms | p99 ms | max ms |\n|---|---:|---:|---:|---:|---:|---:|"
    );
    for s in &r.stages {
        let _ = writeln!(
            out,
            "| `{}` | {} | {} | {} | {} | {} | {} |",
            s.stage,
            s.count,
            s.failed,
            ms(s.p50_ns),
            ms(s.p90_ns),
            ms(s.p99_ns),
            ms(s.max_ns)
        );
    }
    let _ = writeln!(out, "\n## Pods");
    for p in &r.pods {
        let _ = writeln!(out, "\n### {}\n", pod_title(p).replace("  ", " "));
        let _ = writeln!(out, "Sources: {}.\n", sources_line(p));
        let Some(b) = &p.breakdown else {
            continue;
        };
        let _ = writeln!(out, "| part | ms | share | what |\n|---|---:|---:|---|");
        for x in &b.parts {
            let _ = writeln!(
                out,
                "| `{}` | {} | {:.1}% | {} |",
                x.part,
                ms(x.ns),
                x.share,
                x.what.replace('|', "\\|")
            );
        }
        let _ = writeln!(out, "| **total** | {} | 100.0% | |", ms(b.total_ns));
        let _ = writeln!(out, "\n{}.", what_is_left(b));
        for n in &b.notes {
            let _ = writeln!(out, "\nNote: {n}.");
        }
    }
    out
}
