//! `podlapse timeline`: each pod's startup as a waterfall of stages, from a trace file or
//! from the running agent.

use std::fmt::Write as _;
use std::process::ExitCode;

use crate::syncloop::api;
use crate::timeline::{Stage, StageKind, Timeline};
use crate::trace::TraceRecord;

/// Width of the waterfall bar, in characters.
const BAR: usize = 40;

#[derive(Debug, Clone, clap::Args)]
pub struct TimelineArgs {
    #[command(flatten)]
    pub source: super::trace_or_agent::TraceOrAgentArgs,
}

pub async fn run(args: &TimelineArgs) -> ExitCode {
    let args = &args.source;
    let timeline = match args.traces.is_empty() {
        false => match super::trace_file::read_one(&args.traces) {
            Ok(trace) => from_records(&trace.records),
            Err(code) => return code,
        },
        true => {
            let doc = match api::get(&args.socket, "/timeline").await {
                Ok(d) => d,
                Err(e) => {
                    eprintln!("podlapse: {e}");
                    return ExitCode::from(super::EXIT_BAD_INPUT);
                }
            };
            match serde_json::from_value::<Timeline>(doc) {
                Ok(t) => t,
                Err(e) => {
                    eprintln!(
                        "podlapse: agent API {}: not a timeline: {e}",
                        args.socket.display()
                    );
                    return ExitCode::FAILURE;
                }
            }
        }
    };
    let timeline = match &args.pod {
        Some(pod) => {
            let names: Vec<String> = timeline
                .pods
                .iter()
                .map(|p| format!("{}/{}", p.namespace, p.name))
                .collect();
            let t = timeline.only(pod);
            if t.pods.is_empty() {
                eprintln!(
                    "podlapse: {}",
                    super::no_such_pod(pod, "in the timeline", names)
                );
                return ExitCode::FAILURE;
            }
            t
        }
        None => timeline,
    };
    if args.output == super::output::Output::Json {
        println!(
            "{}",
            serde_json::to_string_pretty(&timeline).expect("a timeline serializes")
        );
    } else {
        print!("{}", render(&timeline));
    }
    ExitCode::SUCCESS
}

/// The timeline of the records (see [`crate::timeline::from_records`]).
pub(super) fn from_records(records: &[TraceRecord]) -> Timeline {
    crate::timeline::from_records(records)
}

/// The waterfall: per pod a header, then one line per stage with its start offset from
/// `pod_seen`, its duration, where its times come from, its exit code, and a bar.
pub fn render(t: &Timeline) -> String {
    let mut out = String::new();
    for p in &t.pods {
        let name = if p.name.is_empty() {
            p.uid.clone()
        } else {
            format!("{}/{}", p.namespace, p.name)
        };
        let _ = write!(out, "{name}  uid {}", p.uid);
        if let Some(ip) = &p.ip {
            let _ = write!(out, "  ip {ip}");
        }
        if let Some(s) = p.sandbox_ids.last() {
            let _ = write!(out, "  sandbox {}", short(s));
        }
        out.push('\n');
        let origin = p
            .seen_ns
            .or_else(|| p.stages.iter().map(|s| s.start_ns).min())
            .unwrap_or(0);
        let end = p.stages.iter().map(|s| s.end_ns).max().unwrap_or(origin);
        let span = end.saturating_sub(origin).max(1);
        let _ = writeln!(
            out,
            "  {:<30} {:>10} {:>10}  {:<6} {:>4}  {:<w$}  DETAIL",
            "STAGE",
            "START ms",
            "DUR ms",
            "SOURCE",
            "EXIT",
            "WATERFALL",
            w = BAR + 2
        );
        for s in &p.stages {
            let label = if *s.kind() == StageKind::CniPlugin {
                format!("  {}", s.stage)
            } else {
                s.stage.to_string()
            };
            let exit = match (s.exit_code, s.signal) {
                (Some(c), _) => c.to_string(),
                (None, Some(sig)) => format!("s{sig}"),
                (None, None) => String::new(),
            };
            let mut detail = s.detail.clone();
            if !s.ok {
                detail = format!("FAILED {detail}").trim_end().to_string();
            }
            let _ = writeln!(
                out,
                "  {label:<30} {:>10.3} {:>10.3}  {:<6} {exit:>4}  |{}|  {detail}",
                ms(s.start_ns.saturating_sub(origin)),
                ms(s.duration_ns),
                s.source.to_string(),
                bar(s, origin, span),
            );
        }
        match &p.sources {
            Some(sources) => {
                let _ = writeln!(out, "  sources: {}", sources.line());
                for (name, state) in sources.lacking() {
                    if let Some(why) = state.why() {
                        let _ = writeln!(out, "  {name}: {why}");
                    }
                }
            }
            None => {
                let _ = writeln!(
                    out,
                    "  sources: not recorded (a trace from before podlapse recorded them, or a replay)"
                );
            }
        }
        for n in &p.notes {
            let _ = writeln!(out, "  note: {n}");
        }
        out.push('\n');
    }
    let attributed = t
        .kernel_events
        .saturating_sub(t.node_events + t.other_pod_events);
    let _ = writeln!(
        out,
        "kernel events in the run: {} ({attributed} attributed to its pods, {} node-level, {} of pods it does not run)",
        t.kernel_events, t.node_events, t.other_pod_events
    );
    out
}

fn ms(ns: u64) -> f64 {
    ns as f64 / 1e6
}

fn short(id: &str) -> &str {
    &id[..id.len().min(12)]
}

/// A stage's place on a bar of [`BAR`] characters spanning the pod's timeline: `=` for
/// its duration, `|` for a point in time.
fn bar(s: &Stage, origin: u64, span: u64) -> String {
    let col = |t: u64| ((t.saturating_sub(origin) as u128 * BAR as u128) / span as u128) as usize;
    let from = col(s.start_ns).min(BAR - 1);
    let to = col(s.end_ns).clamp(from + 1, BAR);
    let mark = if s.duration_ns == 0 { "|" } else { "=" };
    let mut b = " ".repeat(from);
    if s.duration_ns == 0 {
        b.push_str(mark);
    } else {
        b.push_str(&mark.repeat(to - from));
    }
    format!("{b:<BAR$}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::timeline::StageSource;

    fn stage(name: &str, start: u64, end: u64) -> Stage {
        Stage::new(
            "u",
            "default",
            "web",
            name.into(),
            start,
            end,
            StageSource::Kernel,
        )
    }

    #[test]
    fn the_waterfall_places_stages_from_pod_seen() {
        let mut failed = stage("cni_plugin:tuning", 50_000_000, 60_000_000);
        failed.ok = false;
        failed.exit_code = Some(1);
        failed.detail = "ADD".into();
        let t = Timeline::from_stages([
            stage("pod_seen", 0, 0),
            stage("cni_add", 20_000_000, 100_000_000),
            failed,
        ]);
        let text = render(&t);
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines[0].starts_with("default/web  uid u"), "{text}");
        let add = lines.iter().find(|l| l.contains("cni_add")).unwrap();
        assert!(add.contains("20.000") && add.contains("80.000"), "{add}");
        assert!(
            add.contains("|        ================================|"),
            "{add}"
        );
        let tuning = lines.iter().find(|l| l.contains("tuning")).unwrap();
        assert!(tuning.starts_with("    cni_plugin:tuning"), "{tuning}");
        assert!(
            tuning.contains("   1  |") && tuning.ends_with("FAILED ADD"),
            "{tuning}"
        );
        let seen = lines.iter().find(|l| l.contains("pod_seen")).unwrap();
        assert!(
            seen.contains(&format!("||{}|", " ".repeat(BAR - 1))),
            "{seen}"
        );
    }
}
