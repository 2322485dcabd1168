//! The diagnosis as text: per pod its verdict, the stage, and the evidence lines.

use std::fmt::Write as _;

use super::Diagnosis;

pub fn render(d: &Diagnosis) -> String {
    let mut out = String::new();
    for f in &d.node {
        let _ = writeln!(out, "node  {}: {}", f.cause, f.summary);
        for e in &f.evidence {
            let _ = writeln!(out, "    - {e}");
        }
    }
    if !d.node.is_empty() {
        out.push('\n');
    }
    for p in &d.pods {
        let v = &p.verdict;
        let _ = writeln!(
            out,
            "{}  uid {}  ip {}  {}",
            p.display_name(),
            p.uid,
            p.ip.as_deref().unwrap_or("<none>"),
            if p.running {
                "reached Running"
            } else {
                "never Running"
            }
        );
        for (i, f) in std::iter::once(v).chain(&p.also).enumerate() {
            let _ = writeln!(
                out,
                "  {}{}  stage {}: {}",
                if i == 0 { "" } else { "also: " },
                f.cause,
                f.stage,
                f.summary
            );
            for e in &f.evidence {
                let _ = writeln!(out, "    - {e}");
            }
        }
        if let Some(sources) = &p.sources {
            let _ = writeln!(out, "  sources: {}", sources.line());
            for (name, state) in sources.lacking() {
                if let Some(why) = state.why() {
                    let _ = writeln!(out, "    - {name}: {why}");
                }
            }
        }
        out.push('\n');
    }
    for n in &d.notes {
        let _ = writeln!(out, "note: {n}");
    }
    let unhealthy = d
        .pods
        .iter()
        .filter(|p| !p.verdict.cause.is_healthy())
        .count();
    let _ = writeln!(
        out,
        "{} pod{}, {} healthy, {unhealthy} with a problem{}",
        d.pods.len(),
        if d.pods.len() == 1 { "" } else { "s" },
        d.pods.len() - unhealthy,
        match d.node.len() {
            0 => String::new(),
            1 => "; 1 finding about the node".to_string(),
            n => format!("; {n} findings about the node"),
        }
    );
    out
}
