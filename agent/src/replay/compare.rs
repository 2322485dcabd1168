//! Recorded against replayed: per pod, the sequence of CRI calls that change state and
//! their key arguments, the first divergence with its context, and startup latencies
//! within a tolerance. Output is ordered and formatted the same on every run.

use std::collections::BTreeMap;
use std::fmt;
use std::fmt::Write as _;

use serde::Serialize;

use podlapse_core::record::CriMethod;

use super::{Divergence, Replayed};
use crate::cri::CriCall;
use crate::trace::{PodOp, Trace, TraceRecord};

/// How far a replayed latency may be from the recorded one and still match.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Tolerance {
    pub abs_ns: u64,
    pub pct: f64,
}

impl Default for Tolerance {
    fn default() -> Self {
        Tolerance {
            abs_ns: 20_000_000,
            pct: 10.0,
        }
    }
}

impl Tolerance {
    fn allows(&self, recorded: u64, replayed: u64) -> bool {
        let diff = recorded.abs_diff(replayed);
        diff <= self.abs_ns || (diff as f64) <= recorded as f64 * self.pct / 100.0
    }
}

// The structs `-o json` writes keep their fields in name order, the order of a JSON
// object's keys in serde_json's maps: the output is serialized straight from them and
// reads as if it went through `serde_json::Value` (a test holds this).

/// One call as compared: what it did, not when.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Step {
    pub attempt: u32,
    pub code: String,
    pub container: String,
    pub image: String,
    pub method: CriMethod,
}

impl fmt::Display for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.method)?;
        if !self.container.is_empty() {
            write!(f, " container={}", self.container)?;
        }
        if !self.image.is_empty() {
            write!(f, " image={}", self.image)?;
        }
        write!(f, " attempt={} -> {}", self.attempt, self.code)
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct FirstDivergence {
    /// The calls just before it, which both agree on.
    pub context: Vec<Step>,
    /// 0-based index in the pod's call sequence.
    pub index: usize,
    pub recorded: Option<Step>,
    pub replayed: Option<Step>,
    /// The replay runtime's own explanation, when it could not answer a call.
    pub why: Option<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct PodComparison {
    /// The trace is incomplete and its recording of this pod ends where the cut came:
    /// the replay went on past it. Only the calls recorded before the cut are compared.
    pub cut_short: bool,
    pub divergence: Option<FirstDivergence>,
    pub latency_ok: bool,
    pub name: String,
    pub namespace: String,
    pub recorded_calls: usize,
    /// From ADD to the last container's first start, ns.
    pub recorded_startup_ns: Option<u64>,
    pub replayed_calls: usize,
    pub replayed_startup_ns: Option<u64>,
    /// Each call's duration and its end from the pod's ADD: (label, recorded, replayed).
    pub stages: Vec<StageLatency>,
    pub uid: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct StageLatency {
    pub recorded_end_ns: Option<u64>,
    pub recorded_ns: Option<u64>,
    pub replayed_end_ns: Option<u64>,
    pub replayed_ns: Option<u64>,
    pub stage: String,
}

/// Per pod UID.
type ByPod<'a, T> = std::collections::HashMap<&'a str, T, foldhash::fast::FixedState>;

/// A call as compared: what it did (its record) and when it ran, as recorded or as
/// replayed.
#[derive(Debug, Clone, Copy)]
struct Timed<'a> {
    call: &'a CriCall,
    start_ns: u64,
    end_ns: u64,
}

impl<'a> Timed<'a> {
    fn recorded(call: &'a CriCall) -> Timed<'a> {
        Timed {
            call,
            start_ns: call.start_ns,
            end_ns: call.end_ns,
        }
    }
}

/// The first occurrence of each call (method, container, image, attempt) of a pod, with
/// its duration and its end measured from the pod's ADD.
fn stage_times(calls: &[Timed], added_ns: u64) -> BTreeMap<String, (u64, u64)> {
    let mut out = BTreeMap::new();
    let mut label = String::new();
    for t in calls {
        let c = t.call;
        label.clear();
        label.push_str(c.method.as_str());
        if !c.container.is_empty() {
            label.push(':');
            label.push_str(&c.container);
        }
        if c.method == CriMethod::PullImage {
            label.push(':');
            label.push_str(&c.image);
        }
        if c.attempt > 0 {
            let _ = write!(label, "#{}", c.attempt);
        }
        if !out.contains_key(&label) {
            out.insert(
                label.clone(),
                (
                    t.end_ns.saturating_sub(t.start_ns),
                    t.end_ns.saturating_sub(added_ns),
                ),
            );
        }
    }
    out
}

impl PodComparison {
    pub fn ok(&self) -> bool {
        self.divergence.is_none() && self.latency_ok
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct Comparison {
    pub pods: Vec<PodComparison>,
    pub recorded_span_ns: u64,
    pub tolerance: Tolerance,
    pub trace: String,
    pub virtual_ns: u64,
}

impl Comparison {
    pub fn ok(&self) -> bool {
        self.pods.iter().all(PodComparison::ok)
    }
}

/// A [`Step`] borrowed from its call: every call of every pod is compared, and only the
/// steps around a divergence are kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct StepRef<'a> {
    attempt: u32,
    code: &'a str,
    container: &'a str,
    image: &'a str,
    method: CriMethod,
}

impl StepRef<'_> {
    fn to_step(self) -> Step {
        Step {
            attempt: self.attempt,
            code: self.code.to_string(),
            container: self.container.to_string(),
            image: self.image.to_string(),
            method: self.method,
        }
    }
}

fn step(c: &CriCall) -> StepRef<'_> {
    StepRef {
        method: c.method,
        container: &c.container,
        attempt: c.attempt,
        image: if c.method == CriMethod::PullImage {
            &c.image
        } else {
            ""
        },
        code: c.code.as_str(),
    }
}

/// Calls that make up a pod's behaviour: state changes, not reads; exec probes are left
/// out because their count follows a period, not a decision.
fn compared(c: &CriCall) -> bool {
    !c.is_observation() && c.method != CriMethod::ExecSync
}

/// Time from the pod's ADD to the end of the first successful start of every container
/// that started.
fn startup(calls: &[Timed], added_ns: u64) -> Option<u64> {
    let mut first: BTreeMap<&str, u64> = BTreeMap::new();
    for t in calls
        .iter()
        .filter(|t| t.call.method == CriMethod::StartContainer && t.call.ok())
    {
        first.entry(t.call.container.as_str()).or_insert(t.end_ns);
    }
    first.values().max().map(|end| end.saturating_sub(added_ns))
}

/// What the comparison takes from the recording alone: the pods, each with its name and
/// the time of its ADD, and each pod's recorded calls. It needs no replay, so it can be
/// made while one runs ([`super::replay_and`]).
pub struct Recorded<'a> {
    pods: BTreeMap<String, (String, String, u64)>,
    /// The recording's CRI calls, in recorded order: a served call names one by index.
    calls: Vec<&'a CriCall>,
    /// Looked up by pod, never listed: hashed.
    by_pod: ByPod<'a, Vec<Timed<'a>>>,
}

impl<'a> Recorded<'a> {
    pub fn of(trace: &'a Trace) -> Recorded<'a> {
        let mut pods: BTreeMap<String, (String, String, u64)> = BTreeMap::new();
        for r in &trace.records {
            if let TraceRecord::Pod(p) = r
                && p.op == PodOp::Add
            {
                let uid = p.pod.metadata.uid.clone().unwrap_or_default();
                pods.entry(uid).or_insert((
                    p.pod.metadata.namespace.clone().unwrap_or_default(),
                    p.pod.metadata.name.clone().unwrap_or_default(),
                    p.at_ns,
                ));
            }
        }
        let calls = trace.cri_calls();
        let mut by_pod: ByPod<Vec<Timed>> = ByPod::default();
        for c in calls.iter().filter(|c| compared(c)) {
            by_pod
                .entry(&c.pod_uid)
                .or_default()
                .push(Timed::recorded(c));
        }
        Recorded {
            pods,
            calls,
            by_pod,
        }
    }
}

/// The recording (`trace`, and what `recorded` took from it) against its replay.
pub fn compare(
    trace: &Trace,
    recorded: &Recorded,
    replayed: &Replayed,
    tolerance: Tolerance,
) -> Comparison {
    let (pods, calls) = (&recorded.pods, &recorded.calls);
    // Each pod's replayed calls and divergences, in one pass over each list.
    // Each served call is its recorded call at the replayed times.
    let mut served: Vec<Timed> = replayed
        .served
        .iter()
        .map(|s| Timed {
            call: calls[s.call],
            start_ns: s.start_ns,
            end_ns: s.end_ns,
        })
        .filter(|t| compared(t.call))
        .collect();
    served.sort_by_key(|t| t.start_ns);
    let mut served_by_pod: ByPod<Vec<Timed>> = ByPod::default();
    for t in served {
        served_by_pod.entry(&t.call.pod_uid).or_default().push(t);
    }
    let mut divergences: ByPod<Vec<&Divergence>> = ByPod::default();
    for d in &replayed.divergences {
        divergences.entry(&d.pod_uid).or_default().push(d);
    }

    let pods: Vec<_> = pods.iter().collect();
    let by_pod = Calls {
        recorded: &recorded.by_pod,
        served: &served_by_pod,
        divergences: &divergences,
    };
    let mut out = on_every_cpu(&pods, |&(uid, (namespace, name, added))| {
        compare_pod(trace, &by_pod, tolerance, uid, namespace, name, *added)
    });
    out.sort_by(|a, b| (&a.namespace, &a.name, &a.uid).cmp(&(&b.namespace, &b.name, &b.uid)));
    let span = trace.ended_ns().saturating_sub(trace.header.started_ns);
    Comparison {
        trace: trace.path.display().to_string(),
        virtual_ns: replayed.virtual_ns,
        recorded_span_ns: span,
        tolerance,
        pods: out,
    }
}

/// Each pod's calls, looked up by its UID.
struct Calls<'a, 'b> {
    recorded: &'b ByPod<'a, Vec<Timed<'a>>>,
    served: &'b ByPod<'a, Vec<Timed<'a>>>,
    divergences: &'b ByPod<'a, Vec<&'a Divergence>>,
}

/// Below this many pods a comparison runs on one thread: a thread costs more than it
/// saves.
const PARALLEL_PODS: usize = 1024;

/// `f` of each item, in order; a long list cut into one run per CPU, each run on a thread
/// of its own. The items are independent, so the result is the same however it is cut.
fn on_every_cpu<T: Sync, U: Send>(items: &[T], f: impl Fn(&T) -> U + Sync) -> Vec<U> {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    if cpus < 2 || items.len() < PARALLEL_PODS {
        return items.iter().map(f).collect();
    }
    let f = &f;
    std::thread::scope(|s| {
        let runs: Vec<_> = items
            .chunks(items.len().div_ceil(cpus))
            .map(|run| s.spawn(move || run.iter().map(f).collect::<Vec<U>>()))
            .collect();
        runs.into_iter()
            .flat_map(|run| {
                // A panic while comparing is a bug: re-raised here, not compared otherwise.
                run.join()
                    .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
            })
            .collect()
    })
}

/// One pod, recorded against replayed.
fn compare_pod(
    trace: &Trace,
    calls: &Calls,
    tolerance: Tolerance,
    uid: &str,
    namespace: &str,
    name: &str,
    added: u64,
) -> PodComparison {
    let rec: &[Timed] = calls.recorded.get(uid).map_or(&[], Vec::as_slice);
    let rep: &[Timed] = calls.served.get(uid).map_or(&[], Vec::as_slice);
    let rec_steps: Vec<StepRef> = rec.iter().map(|t| step(t.call)).collect();
    let mut rep_steps: Vec<(u64, StepRef)> =
        rep.iter().map(|t| (t.start_ns, step(t.call))).collect();
    let mut why = BTreeMap::new();
    for d in calls.divergences.get(uid).into_iter().flatten() {
        let s = StepRef {
            method: d.method,
            container: &d.container,
            attempt: d.attempt,
            image: &d.image,
            code: "NOT IN RECORDING",
        };
        why.insert(format!("{}", s.to_step()), d.why.clone());
        rep_steps.push((d.at_ns, s));
    }
    rep_steps.sort_by_key(|(at, _)| *at);
    let rep_steps: Vec<StepRef> = rep_steps.into_iter().map(|(_, s)| s).collect();
    let mut divergence = first_divergence(&rec_steps, &rep_steps).map(|mut d| {
        d.why = d
            .replayed
            .as_ref()
            .and_then(|s| why.get(&format!("{s}")).cloned());
        d
    });
    // In a trace cut short, a pod whose recorded calls are all matched and the replay
    // merely goes on (with the call the cut left unfinished, which was never recorded)
    // is compared as far as it was recorded; a call that differs still diverges.
    let cut_short =
        !trace.is_complete() && divergence.as_ref().is_some_and(|d| d.recorded.is_none());
    if cut_short {
        divergence = None;
    }
    let recorded_startup_ns = startup(rec, added);
    let replayed_startup_ns = startup(rep, added);
    let latency_ok = match (recorded_startup_ns, replayed_startup_ns) {
        (Some(a), Some(b)) => tolerance.allows(a, b),
        (None, None) => true,
        (None, Some(_)) => cut_short,
        (Some(_), None) => false,
    };
    let rec_stages = stage_times(rec, added);
    let rep_stages = stage_times(rep, added);
    let stages = stage_rows(&rec_stages, &rep_stages);
    PodComparison {
        cut_short,
        stages,
        namespace: namespace.to_string(),
        name: name.to_string(),
        uid: uid.to_string(),
        recorded_calls: rec_steps.len(),
        replayed_calls: rep_steps.len(),
        divergence,
        recorded_startup_ns,
        replayed_startup_ns,
        latency_ok,
    }
}

/// Each stage of either side once, in order of its end: the recorded one where both have
/// it (a stage only replayed by its replayed end); stages that end together keep name
/// order, the recorded ones first.
fn stage_rows(
    rec: &BTreeMap<String, (u64, u64)>,
    rep: &BTreeMap<String, (u64, u64)>,
) -> Vec<StageLatency> {
    let mut labels: Vec<(&String, u64)> = rec
        .iter()
        .chain(rep.iter().filter(|(l, _)| !rec.contains_key(*l)))
        .map(|(l, t)| (l, t.1))
        .collect();
    labels.sort_by_key(|(_, end)| *end);
    labels
        .into_iter()
        .map(|(l, _)| {
            let (r, p) = (rec.get(l), rep.get(l));
            StageLatency {
                stage: l.clone(),
                recorded_ns: r.map(|t| t.0),
                replayed_ns: p.map(|t| t.0),
                recorded_end_ns: r.map(|t| t.1),
                replayed_end_ns: p.map(|t| t.1),
            }
        })
        .collect()
}

fn first_divergence(rec: &[StepRef], rep: &[StepRef]) -> Option<FirstDivergence> {
    let n = rec.len().max(rep.len());
    (0..n)
        .find(|&i| rec.get(i) != rep.get(i))
        .map(|i| FirstDivergence {
            index: i,
            recorded: rec.get(i).map(|s| s.to_step()),
            replayed: rep.get(i).map(|s| s.to_step()),
            context: rec[i.saturating_sub(3)..i]
                .iter()
                .map(|s| s.to_step())
                .collect(),
            why: None,
        })
}

fn ms(ns: Option<u64>) -> String {
    ns.map(|n| format!("{:.1} ms", n as f64 / 1e6))
        .unwrap_or_else(|| "-".into())
}

impl Comparison {
    /// The per-stage table of a what-if replay: recorded and predicted durations and
    /// end times from each pod's ADD.
    pub fn stage_table(&self) -> String {
        let mut s = String::new();
        for p in &self.pods {
            s.push_str(&format!("{}/{}\n", p.namespace, p.name));
            s.push_str(&format!(
                "  {:<44} {:>12} {:>12} {:>12} {:>12}\n",
                "STAGE", "TOOK rec", "TOOK what-if", "DONE AT rec", "DONE AT w-if"
            ));
            for st in &p.stages {
                s.push_str(&format!(
                    "  {:<44} {:>12} {:>12} {:>12} {:>12}\n",
                    st.stage,
                    ms(st.recorded_ns),
                    ms(st.replayed_ns),
                    ms(st.recorded_end_ns),
                    ms(st.replayed_end_ns)
                ));
            }
        }
        s
    }
}

impl fmt::Display for Comparison {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "trace {}: {} pods, recorded span {:.3} s, replayed in virtual time",
            self.trace,
            self.pods.len(),
            self.recorded_span_ns as f64 / 1e9
        )?;
        writeln!(
            f,
            "{:<36} {:>9} {:<6} {:>13} {:>13} {:>10}",
            "POD", "CALLS", "CALLS", "STARTUP", "STARTUP", "DELTA"
        )?;
        writeln!(
            f,
            "{:<36} {:>9} {:<6} {:>13} {:>13} {:>10}",
            "", "rec/rep", "match", "recorded", "replayed", ""
        )?;
        for p in &self.pods {
            let delta = match (p.recorded_startup_ns, p.replayed_startup_ns) {
                (Some(a), Some(b)) => format!(
                    "{:+.1} ms{}",
                    (b as f64 - a as f64) / 1e6,
                    if p.latency_ok { "" } else { " !" }
                ),
                _ if p.latency_ok => "-".into(),
                _ => "missing !".into(),
            };
            writeln!(
                f,
                "{:<36} {:>9} {:<6} {:>13} {:>13} {:>10}",
                format!("{}/{}", p.namespace, p.name),
                format!("{}/{}", p.recorded_calls, p.replayed_calls),
                match (&p.divergence, p.cut_short) {
                    (Some(_), _) => "NO",
                    (None, true) => "cut",
                    (None, false) => "yes",
                },
                ms(p.recorded_startup_ns),
                ms(p.replayed_startup_ns),
                delta
            )?;
        }
        if self.pods.iter().any(|p| p.cut_short) {
            writeln!(
                f,
                "(cut: the trace ends while this pod was in flight; its calls are compared up to the cut)"
            )?;
        }
        for p in &self.pods {
            let Some(d) = &p.divergence else { continue };
            writeln!(
                f,
                "first divergence in {}/{} at call #{}:",
                p.namespace,
                p.name,
                d.index + 1
            )?;
            for c in &d.context {
                writeln!(f, "    both:     {c}")?;
            }
            match &d.recorded {
                Some(s) => writeln!(f, "    recorded: {s}")?,
                None => writeln!(f, "    recorded: (nothing more)")?,
            }
            match &d.replayed {
                Some(s) => writeln!(f, "    replayed: {s}")?,
                None => writeln!(f, "    replayed: (nothing more)")?,
            }
            if let Some(why) = &d.why {
                writeln!(f, "    why:      {why}")?;
            }
        }
        let bad_latency: Vec<&PodComparison> = self.pods.iter().filter(|p| !p.latency_ok).collect();
        if !bad_latency.is_empty() {
            writeln!(
                f,
                "startup latency outside tolerance ({:.1} ms or {}%): {}",
                self.tolerance.abs_ns as f64 / 1e6,
                self.tolerance.pct,
                bad_latency
                    .iter()
                    .map(|p| format!("{}/{}", p.namespace, p.name))
                    .collect::<Vec<_>>()
                    .join(", ")
            )?;
        }
        writeln!(
            f,
            "result: {}",
            if self.ok() { "match" } else { "DIVERGED" }
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn step(method: &str) -> Step {
        Step {
            attempt: 1,
            code: "OK".into(),
            container: "app".into(),
            image: "img".into(),
            method: method.parse().expect("a CRI method"),
        }
    }

    /// Every field set, nested ones included.
    fn full() -> Comparison {
        Comparison {
            pods: vec![PodComparison {
                cut_short: false,
                divergence: Some(FirstDivergence {
                    context: vec![step("CreateContainer")],
                    index: 3,
                    recorded: Some(step("StartContainer")),
                    replayed: Some(step("PullImage")),
                    why: Some("because".into()),
                }),
                latency_ok: false,
                name: "p".into(),
                namespace: "default".into(),
                recorded_calls: 5,
                recorded_startup_ns: Some(7),
                replayed_calls: 6,
                replayed_startup_ns: Some(8),
                stages: vec![StageLatency {
                    recorded_end_ns: Some(1),
                    recorded_ns: Some(2),
                    replayed_end_ns: Some(3),
                    replayed_ns: None,
                    stage: "RunPodSandbox".into(),
                }],
                uid: "u".into(),
            }],
            recorded_span_ns: 9,
            tolerance: Tolerance::default(),
            trace: "t.jsonl".into(),
            virtual_ns: 10,
        }
    }

    fn stages(pairs: &[(&str, u64, u64)]) -> BTreeMap<String, (u64, u64)> {
        pairs
            .iter()
            .map(|&(l, d, e)| (l.to_string(), (d, e)))
            .collect()
    }

    /// A stage is one row whatever ends with it: two stages both sides have, ending at the
    /// same recorded time, once came out twice each.
    #[test]
    fn every_stage_is_one_row_in_order_of_its_end() {
        let rec = stages(&[("B", 2, 5), ("A", 1, 5), ("D", 1, 9)]);
        let rep = stages(&[("A", 1, 6), ("B", 3, 7), ("C", 4, 7), ("E", 1, 1)]);
        let rows = stage_rows(&rec, &rep);
        let order: Vec<&str> = rows.iter().map(|r| r.stage.as_str()).collect();
        assert_eq!(order, ["E", "A", "B", "C", "D"]);
        let b = &rows[2];
        assert_eq!(
            (
                b.recorded_ns,
                b.replayed_ns,
                b.recorded_end_ns,
                b.replayed_end_ns
            ),
            (Some(2), Some(3), Some(5), Some(7))
        );
        let c = &rows[3];
        assert_eq!((c.recorded_ns, c.replayed_ns), (None, Some(4)));
        let d = &rows[4];
        assert_eq!((d.replayed_ns, d.recorded_end_ns), (None, Some(9)));
    }

    #[test]
    fn json_output_has_its_keys_in_name_order() {
        let direct = serde_json::to_string_pretty(&full()).unwrap();
        let via_value =
            serde_json::to_string_pretty(&serde_json::to_value(full()).unwrap()).unwrap();
        assert_eq!(direct, via_value);
    }
}
