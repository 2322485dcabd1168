//! Pictures for people: one pod's startup waterfall, and every stage's latency
//! distribution across pods, as one SVG a browser shows.
//!
//! The waterfall has a row per stage on a linear time axis from pod_seen: a bar for a
//! span, a diamond for an instant, coloured by where the time comes from (CRI, kernel,
//! agent), red when the stage failed. The distributions share one logarithmic axis
//! (stage latencies span microseconds to seconds): every recorded value as a dot, a box
//! from p50 to p90, a line from the smallest to the largest value, and the figures in
//! words beside it. Hovering a mark shows its details (`<title>`).

use svg::Document;
use svg::node::element::{Circle, Group, Line, Polygon, Rectangle, Text, Title};

use super::TraceInput;
use super::stats::{in_pipeline_order, percentile, samples};
use crate::timeline::{PodTimeline, Stage, StageKind, StageSource};

const WIDTH: f64 = 1200.0;
const LABEL_X: f64 = 16.0;
const CHART_X: f64 = 260.0;
const CHART_W: f64 = 640.0;
const ROW: f64 = 20.0;
const FONT: &str = "DejaVu Sans, Helvetica, Arial, sans-serif";

const CRI: &str = "#4c78a8";
const KERNEL: &str = "#f58518";
const AGENT: &str = "#54a24b";
const RUNTIME: &str = "#b279a2";
const FAILED: &str = "#d62728";
const GRID: &str = "#dddddd";
const INK: &str = "#222222";
const MUTED: &str = "#666666";

/// A coordinate or size with one decimal: enough for a screen, and stable text.
fn n(x: f64) -> String {
    format!("{x:.1}")
}

fn ms(ns: u64) -> String {
    let v = ns as f64 / 1e6;
    if v >= 100.0 {
        format!("{v:.0} ms")
    } else if v >= 1.0 {
        format!("{v:.1} ms")
    } else {
        format!("{v:.3} ms")
    }
}

fn text(x: f64, y: f64, size: f64, content: impl Into<String>) -> Text {
    Text::new(content)
        .set("x", n(x))
        .set("y", n(y))
        .set("font-size", n(size))
        .set("font-family", FONT)
        .set("fill", INK)
}

fn line(x1: f64, y1: f64, x2: f64, y2: f64, stroke: &str) -> Line {
    Line::new()
        .set("x1", n(x1))
        .set("y1", n(y1))
        .set("x2", n(x2))
        .set("y2", n(y2))
        .set("stroke", stroke)
        .set("stroke-width", 1)
}

/// The shaded background of every other row, from `y`.
fn stripe(y: f64) -> Rectangle {
    Rectangle::new()
        .set("x", n(LABEL_X - 4.0))
        .set("y", n(y))
        .set("width", n(WIDTH - 2.0 * LABEL_X + 8.0))
        .set("height", n(ROW))
        .set("fill", "#f4f4f4")
}

fn colour(s: &Stage) -> &'static str {
    if !s.ok {
        return FAILED;
    }
    match s.source {
        // The kubelet's calls are CRI calls too, as the client saw them.
        StageSource::Cri | StageSource::Kubelet => CRI,
        StageSource::Kernel => KERNEL,
        StageSource::Agent => AGENT,
        StageSource::Runtime => RUNTIME,
    }
}

/// A step of 1, 2 or 5 times a power of ten giving about `ticks` ticks over `span`.
fn nice_step(span: f64, ticks: f64) -> f64 {
    let raw = (span / ticks).max(f64::MIN_POSITIVE);
    let mag = 10f64.powf(raw.log10().floor());
    [1.0, 2.0, 5.0, 10.0]
        .into_iter()
        .map(|m| m * mag)
        .find(|s| *s >= raw)
        .unwrap_or(10.0 * mag)
}

/// The pod the waterfall shows: the one `chosen` names; by default the slowest to reach
/// Running (the first of equals), else the first pod.
fn waterfall_pod<'a>(
    inputs: &'a [TraceInput],
    chosen: Option<&str>,
) -> Option<(&'a str, &'a PodTimeline)> {
    let all = || {
        inputs
            .iter()
            .flat_map(|t| t.timeline.pods.iter().map(move |p| (t.name.as_str(), p)))
    };
    if let Some(pod) = chosen {
        return all().find(|(_, p)| p.is(pod));
    }
    all()
        .filter_map(|(t, p)| Some((p.to_running_ns()?, t, p)))
        .reduce(|slowest, next| if next.0 > slowest.0 { next } else { slowest })
        .map(|(_, t, p)| (t, p))
        .or_else(|| all().next())
}

/// The SVG document for `inputs` (already narrowed to the pods wanted): the waterfall of
/// the pod `waterfall_of` names (by default the slowest to Running) above the stage
/// distributions of all of them.
pub fn svg(inputs: &[TraceInput], waterfall_of: Option<&str>) -> String {
    let mut y = 28.0;
    let traces: Vec<&str> = inputs.iter().map(|t| t.name.as_str()).collect();
    let mut names = traces.join(", ");
    if names.chars().count() > 110 {
        names = format!("{} traces", traces.len());
    }
    let heading =
        text(LABEL_X, y, 18.0, format!("podlapse report: {names}")).set("font-weight", "bold");
    y += 16.0;
    let first = match waterfall_pod(inputs, waterfall_of) {
        Some((trace, pod)) => {
            let (g, h) = waterfall(trace, pod, y + 20.0);
            y += 20.0 + h;
            g
        }
        None => {
            y += 24.0;
            Group::new().add(text(LABEL_X, y, 13.0, "no pod in the input"))
        }
    };
    let (second, h) = distributions(inputs, y + 30.0);
    y += 30.0 + h + 16.0;
    // A white page under everything, so the picture reads the same on a dark viewer.
    let background = Rectangle::new()
        .set("x", 0)
        .set("y", 0)
        .set("width", n(WIDTH))
        .set("height", n(y))
        .set("fill", "white");
    let doc = Document::new()
        .set("width", n(WIDTH))
        .set("height", n(y))
        .set("viewBox", format!("0 0 {} {}", n(WIDTH), n(y)))
        .add(background)
        .add(heading)
        .add(first)
        .add(second);
    format!("{doc}\n")
}

/// The waterfall group at `top`, and its height.
fn waterfall(trace: &str, p: &PodTimeline, top: f64) -> (Group, f64) {
    let mut g = Group::new().set("id", "waterfall");
    let origin = p
        .seen_ns
        .or_else(|| p.stages.iter().map(|s| s.start_ns).min())
        .unwrap_or(0);
    // A pod that ran is drawn until it was Running (or Ready): later restarts would
    // squeeze its startup into a sliver. They stay in `podlapse timeline`.
    let until = p.stage(StageKind::Running).map(|r| {
        p.stage(StageKind::Ready)
            .map_or(r.start_ns, |ready| ready.start_ns.max(r.start_ns))
    });
    let stages: Vec<&Stage> = p
        .stages
        .iter()
        .filter(|s| until.is_none_or(|u| s.start_ns <= u))
        .collect();
    let hidden = p.stages.len() - stages.len();
    let end = stages.iter().map(|s| s.end_ns).max().unwrap_or(origin);
    let span_ms = (end.saturating_sub(origin) as f64 / 1e6).max(0.001);
    let name = if p.name.is_empty() {
        p.uid.clone()
    } else {
        format!("{}/{}", p.namespace, p.name)
    };
    let title = match (p.seen_ns, p.stage(StageKind::Running)) {
        (Some(seen), Some(r)) => format!(
            "Waterfall: {name} ({trace}), Running after {}",
            ms(r.start_ns.saturating_sub(seen))
        ),
        _ => format!("Waterfall: {name} ({trace}), did not reach Running"),
    };
    g = g.add(text(LABEL_X, top, 15.0, title).set("font-weight", "bold"));
    g = legend(g, top);
    let axis_y = top + 46.0;
    let rows_top = axis_y + 8.0;
    let rows_h = stages.len() as f64 * ROW;
    g = time_axis(g, span_ms, axis_y, rows_top + rows_h);
    let scale = Scale { origin, span_ms };
    for (i, s) in stages.iter().copied().enumerate() {
        g = stage_row(g, &scale, rows_top + i as f64 * ROW, i, s);
    }
    let mut h = rows_top + rows_h - top;
    if hidden > 0 {
        h += 18.0;
        g = g.add(
            text(
                LABEL_X,
                top + h - 4.0,
                12.0,
                format!(
                    "{hidden} later stage{} (restarts after Running) not drawn: see `podlapse timeline`",
                    if hidden == 1 { "" } else { "s" }
                ),
            )
            .set("fill", MUTED),
        );
    }
    (g, h)
}

/// Where a time falls on the waterfall's chart: `origin` at its left edge, `span_ms` across.
struct Scale {
    origin: u64,
    span_ms: f64,
}

impl Scale {
    fn x(&self, t: u64) -> f64 {
        CHART_X + (t.saturating_sub(self.origin) as f64 / 1e6) / self.span_ms * CHART_W
    }
}

/// The waterfall's legend of colours, below its title at `top`.
fn legend(mut g: Group, top: f64) -> Group {
    let mut legend_x = LABEL_X;
    for (label, c) in [
        ("CRI call", CRI),
        ("kernel (eBPF)", KERNEL),
        ("agent", AGENT),
        ("runtime's spans", RUNTIME),
        ("failed", FAILED),
    ] {
        g = g.add(
            Rectangle::new()
                .set("x", n(legend_x))
                .set("y", n(top + 10.0))
                .set("width", 12)
                .set("height", 12)
                .set("fill", c),
        );
        g = g.add(text(legend_x + 17.0, top + 20.5, 12.0, label).set("fill", MUTED));
        legend_x += 120.0;
    }
    g
}

/// The time axis above the rows, with a grid line per tick down to `rows_bottom`.
fn time_axis(mut g: Group, span_ms: f64, axis_y: f64, rows_bottom: f64) -> Group {
    let step = nice_step(span_ms, 8.0);
    let mut t = 0.0;
    while t <= span_ms + step * 1e-9 {
        let x = CHART_X + t / span_ms * CHART_W;
        g = g.add(line(x, axis_y, x, rows_bottom, GRID));
        g = g.add(
            text(x, axis_y - 4.0, 11.0, format!("{t:.0} ms"))
                .set("text-anchor", "middle")
                .set("fill", MUTED),
        );
        t += step;
    }
    g
}

/// One stage's row at `y` (the `i`th): its name, its bar (or a diamond for an instant)
/// with the details as a tooltip, and its duration and outcome beside it.
fn stage_row(mut g: Group, scale: &Scale, y: f64, i: usize, s: &Stage) -> Group {
    let origin = scale.origin;
    if i % 2 == 1 {
        g = g.add(stripe(y));
    }
    let indent = if *s.kind() == StageKind::CniPlugin {
        14.0
    } else {
        0.0
    };
    g = g.add(text(LABEL_X + indent, y + 14.5, 12.0, s.stage.to_string()));
    let mut tip = format!(
        "{}: start +{}, {} ({}){}",
        s.stage,
        ms(s.start_ns.saturating_sub(origin)),
        ms(s.duration_ns),
        s.source,
        if s.ok { "" } else { ", FAILED" }
    );
    if let Some(c) = s.exit_code {
        tip.push_str(&format!(", exit code {c}"));
    }
    if !s.detail.is_empty() {
        tip.push_str(&format!("\n{}", s.detail));
    }
    let x0 = scale.x(s.start_ns);
    let cy = y + ROW / 2.0;
    let (mark_end, label) = if s.duration_ns == 0 {
        let d = 5.0;
        let points = format!(
            "{},{} {},{} {},{} {},{}",
            n(x0),
            n(cy - d),
            n(x0 + d),
            n(cy),
            n(x0),
            n(cy + d),
            n(x0 - d),
            n(cy)
        );
        g = g.add(
            Polygon::new()
                .set("class", "instant")
                .set("points", points)
                .set("fill", colour(s))
                .add(Title::new(tip)),
        );
        (
            x0 + d,
            format!("at {}", ms(s.start_ns.saturating_sub(origin))),
        )
    } else {
        let w = (scale.x(s.end_ns) - x0).max(1.5);
        g = g.add(
            Rectangle::new()
                .set("class", "stage")
                .set("x", n(x0))
                .set("y", n(y + 4.0))
                .set("width", n(w))
                .set("height", n(ROW - 8.0))
                .set("fill", colour(s))
                .add(Title::new(tip)),
        );
        (x0 + w, ms(s.duration_ns))
    };
    let label = match (s.ok, s.exit_code) {
        (false, Some(c)) => format!("{label}  exit {c}"),
        (false, None) => format!("{label}  failed"),
        _ => label,
    };
    g = g.add(
        text(mark_end + 5.0, y + 14.5, 11.0, label).set("fill", if s.ok { MUTED } else { FAILED }),
    );
    g
}

/// The distributions group at `top`, and its height.
fn distributions(inputs: &[TraceInput], top: f64) -> (Group, f64) {
    let mut g = Group::new().set("id", "distributions");
    let pods: Vec<&PodTimeline> = inputs.iter().flat_map(|t| &t.timeline.pods).collect();
    let all = samples(pods.iter().copied());
    let mut names: Vec<String> = all.keys().cloned().collect();
    in_pipeline_order(&mut names);
    g = g.add(
        text(
            LABEL_X,
            top,
            15.0,
            format!(
                "Stage latency across {} pod{}: a dot per recorded value, box p50 to p90, line min to max",
                pods.len(),
                if pods.len() == 1 { "" } else { "s" }
            ),
        )
        .set("font-weight", "bold"),
    );
    let values = all.values().flatten().map(|(ns, _)| *ns as f64 / 1e6);
    let positive: Vec<f64> = values.filter(|v| *v > 0.0).collect();
    let lo_exp = positive
        .iter()
        .fold(f64::INFINITY, |a, b| a.min(*b))
        .log10()
        .floor()
        .clamp(-3.0, 6.0) as i32;
    let hi_exp = positive
        .iter()
        .fold(0.001f64, |a, b| a.max(*b))
        .log10()
        .ceil()
        .clamp(f64::from(lo_exp + 1), 7.0) as i32;
    let lo = 10f64.powi(lo_exp);
    let decades = f64::from(hi_exp - lo_exp);
    let x_of = |ns: u64| {
        let v = (ns as f64 / 1e6).max(lo);
        CHART_X + (v / lo).log10() / decades * CHART_W
    };
    let axis_y = top + 30.0;
    let rows_top = axis_y + 8.0;
    let rows_h = names.len() as f64 * ROW;
    for e in lo_exp..=hi_exp {
        let v = 10f64.powi(e);
        let x = CHART_X + f64::from(e - lo_exp) / decades * CHART_W;
        g = g.add(line(x, axis_y, x, rows_top + rows_h, GRID));
        let label = if v >= 1.0 {
            format!("{v:.0} ms")
        } else {
            format!("{v} ms")
        };
        g = g.add(
            text(x, axis_y - 4.0, 11.0, label)
                .set("text-anchor", "middle")
                .set("fill", MUTED),
        );
    }
    for (i, name) in names.iter().enumerate() {
        let y = rows_top + i as f64 * ROW;
        let cy = y + ROW / 2.0;
        if i % 2 == 1 {
            g = g.add(stripe(y));
        }
        g = g.add(text(LABEL_X, y + 14.5, 12.0, name.clone()));
        let v = &all[name];
        let mut sorted: Vec<u64> = v.iter().map(|(ns, _)| *ns).collect();
        sorted.sort_unstable();
        let (min, max) = (sorted[0], sorted[sorted.len() - 1]);
        let (p50, p90) = (percentile(&sorted, 50), percentile(&sorted, 90));
        g = g.add(line(x_of(min), cy, x_of(max), cy, MUTED));
        g = g.add(
            Rectangle::new()
                .set("class", "box")
                .set("x", n(x_of(p50)))
                .set("y", n(y + 4.0))
                .set("width", n((x_of(p90) - x_of(p50)).max(1.5)))
                .set("height", n(ROW - 8.0))
                .set("fill", "#c6dbef")
                .set("stroke", CRI)
                .add(Title::new(format!(
                    "{name}: p50 {}, p90 {}",
                    ms(p50),
                    ms(p90)
                ))),
        );
        g = g.add(line(x_of(p50), y + 3.0, x_of(p50), y + ROW - 3.0, INK).set("stroke-width", 2));
        for (j, (ns, ok)) in v.iter().enumerate() {
            // Spread equal values a little apart, the same way every time.
            let dy = (j % 5) as f64 * 1.6 - 3.2;
            g = g.add(
                Circle::new()
                    .set("class", "sample")
                    .set("cx", n(x_of(*ns)))
                    .set("cy", n(cy + dy))
                    .set("r", 2.6)
                    .set("fill", if *ok { INK } else { FAILED })
                    .set("fill-opacity", 0.55)
                    .add(Title::new(format!("{name}: {}", ms(*ns)))),
            );
        }
        g = g.add(
            text(
                CHART_X + CHART_W + 12.0,
                y + 14.5,
                11.0,
                format!(
                    "n={}  p50 {}  p90 {}  max {}",
                    sorted.len(),
                    ms(p50),
                    ms(p90),
                    ms(max)
                ),
            )
            .set("fill", MUTED),
        );
    }
    (g, rows_top + rows_h - top)
}
