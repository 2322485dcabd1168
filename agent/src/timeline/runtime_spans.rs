//! The runtime's own spans (`runtime_span` records, from `--runtime-otlp-listen`) as
//! stages inside the CRI call that holds them.
//!
//! A span belongs to a call when its chain of parents reaches that call's span: podlapse
//! derives each call's span ID (`otel::ids::call_span_id`) and sent it as the call's
//! `traceparent`, so the runtime's server span for the call is its child and the
//! runtime's work hangs under that. Spans whose chain ends elsewhere (a parent not
//! received) are no stage.
//!
//! A small vocabulary of containerd's span names becomes stages, `runtime:<step>` (with
//! `:<container>` for a container's calls and pulls); other spans are no stage (they
//! still reach the collector in the export, and their time stays in the call's
//! remainder):
//!
//! | stage | containerd 2.x spans |
//! |---|---|
//! | `runtime:sandbox_image_pull` | in RunPodSandbox, from the first to the last span of its image work (`pull.*`, `pkg.unpack.*`, `remotes.*`) |
//! | `runtime:image_resolve` | a registry request (`remotes.*`) outside a layer's fetch: the reference, the manifest, the config |
//! | `runtime:image_fetch` | `pull.fetch`, `pkg.unpack.unpacker.fetchLayer` (a layer's download) |
//! | `runtime:image_unpack` | `pkg.unpack.unpacker.unpackLayer` (a layer applied to its snapshot) |
//! | `runtime:network_setup` | in RunPodSandbox, from the `setup pod network` event until containerd saved the CNI result (the end of the second `metadata.*` span after the event; without one, until the next span that is not `metadata.*`, else the end of its server span) |
//! | `runtime:metadata` | `metadata.*` (containerd's metadata store: the sandbox's and container's records) |
//! | `runtime:container_new` | `client.NewContainer` |
//! | `runtime:task_create` | `container.NewTask`, or the shim's ttrpc `.../Task/Create` |
//! | `runtime:task_start` | `task.Start`, or the shim's ttrpc `.../Task/Start` |
//!
//! A span inside another of the same step (the ttrpc `Task/Create` inside
//! `container.NewTask`, a registry request inside a layer's fetch) is part of it, not a
//! stage of its own. Stages are clamped into their call: the runtime's clock is read as
//! wall time and placed on the trace's clock by the run's anchor.

use std::collections::HashMap;

use podlapse_core::record::{CriMethod, GrpcCode};

use crate::cri::CriCall;
use podlapse_core::record::RuntimeSpan;

/// A step of the runtime's own work.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Step {
    SandboxImagePull,
    ImageResolve,
    ImageFetch,
    ImageUnpack,
    NetworkSetup,
    Metadata,
    ContainerNew,
    TaskCreate,
    TaskStart,
}

impl Step {
    pub const ALL: [Step; 9] = [
        Step::SandboxImagePull,
        Step::ImageResolve,
        Step::ImageFetch,
        Step::ImageUnpack,
        Step::NetworkSetup,
        Step::Metadata,
        Step::ContainerNew,
        Step::TaskCreate,
        Step::TaskStart,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Step::SandboxImagePull => "sandbox_image_pull",
            Step::ImageResolve => "image_resolve",
            Step::ImageFetch => "image_fetch",
            Step::ImageUnpack => "image_unpack",
            Step::NetworkSetup => "network_setup",
            Step::Metadata => "metadata",
            Step::ContainerNew => "container_new",
            Step::TaskCreate => "task_create",
            Step::TaskStart => "task_start",
        }
    }

    /// True when a span of this step inside one of `outer`'s is part of it.
    fn folds_into(self, outer: Step) -> bool {
        self == outer || (self == Step::ImageResolve && outer == Step::ImageFetch)
    }
}

/// The step a span of this name is, if any. The two made of several spans
/// (`sandbox_image_pull`, `network_setup`) are not named by one span.
pub fn step_of(name: &str) -> Option<Step> {
    match name {
        "client.NewContainer" => Some(Step::ContainerNew),
        "container.NewTask" => Some(Step::TaskCreate),
        "task.Start" => Some(Step::TaskStart),
        "pull.fetch" => Some(Step::ImageFetch),
        n if n.ends_with("/Task/Create") || n.ends_with(".Task/Create") => Some(Step::TaskCreate),
        n if n.ends_with("/Task/Start") || n.ends_with(".Task/Start") => Some(Step::TaskStart),
        n if n.starts_with("metadata.") => Some(Step::Metadata),
        n if n.starts_with("pkg.unpack.") && n.ends_with(".fetchLayer") => Some(Step::ImageFetch),
        n if n.starts_with("pkg.unpack.") && n.ends_with(".unpackLayer") => Some(Step::ImageUnpack),
        n if n.starts_with("remotes.") => Some(Step::ImageResolve),
        _ => None,
    }
}

/// Image work: a pull, an unpack, a registry request.
fn is_image_work(name: &str) -> bool {
    name.starts_with("pull.") || name.starts_with("pkg.unpack.") || name.starts_with("remotes.")
}

/// containerd's event on RunPodSandbox's span as it creates the sandbox's network.
pub const NETWORK_EVENT: &str = "setup pod network";

/// How deep a chain of parents is followed.
const MAX_DEPTH: usize = 64;

/// For each of `spans`, the index in `calls` of the call whose span its chain of parents
/// reaches, if any. Only calls sent with a sampled context (`traced`) can have the
/// runtime's spans under them.
pub fn attribute(calls: &[&CriCall], spans: &[&RuntimeSpan]) -> Vec<Option<usize>> {
    let call_of: HashMap<String, usize> = calls
        .iter()
        .enumerate()
        .filter(|(_, c)| c.traced)
        .map(|(i, c)| (hex(&podlapse_core::record::ids::call_span_id(c)), i))
        .collect();
    let span_of: HashMap<&str, &RuntimeSpan> =
        spans.iter().map(|s| (s.span_id.as_str(), *s)).collect();
    spans
        .iter()
        .map(|s| {
            let mut cur = *s;
            for _ in 0..MAX_DEPTH {
                if let Some(&c) = call_of.get(&cur.parent_span_id) {
                    return Some(c);
                }
                cur = span_of.get(cur.parent_span_id.as_str())?;
            }
            None
        })
        .collect()
}

/// The CRI method a runtime's server span is the handling of (`runtime.v1.RuntimeService/
/// RunPodSandbox`, `runtime.v1.ImageService/PullImage`), if it is one podlapse knows (a
/// kubelet also calls methods podlapse does not, such as ImageFsInfo: no call stands for
/// those, and their spans stay unplaced like any other of no call).
fn server_method(s: &RuntimeSpan) -> Option<CriMethod> {
    if s.kind != "server" {
        return None;
    }
    let (service, method) = s.name.rsplit_once('/')?;
    if !service.starts_with("runtime.v1.") {
        return None;
    }
    method.parse().ok()
}

/// For a pod podlapse did not run (an observed one), the calls its runtime spans are
/// under: the runtime's own server span of each CRI call stands for the call, with the
/// sandbox and container it names. Returns the calls, in the order they started, and for
/// each span the call whose server span it is or its chain of parents reaches.
pub fn server_calls(pod_uid: &str, spans: &[&RuntimeSpan]) -> (Vec<CriCall>, Vec<Option<usize>>) {
    let mut servers: Vec<&RuntimeSpan> = spans
        .iter()
        .copied()
        .filter(|s| server_method(s).is_some())
        .collect();
    servers.sort_by_key(|s| (s.start_ns, s.end_ns));
    let text = |s: &RuntimeSpan, k: &str| {
        s.attributes
            .get(k)
            .and_then(serde_json::Value::as_str)
            .unwrap_or_default()
            .to_string()
    };
    let calls: Vec<CriCall> = servers
        .iter()
        .filter_map(|s| Some((s, server_method(s)?)))
        .map(|(s, method)| {
            // containerd's `container.name` is `<container>_<pod>_<namespace>_<uid>_<n>`.
            let name = text(s, "container.name");
            let container = name.split('_').next().unwrap_or_default();
            let code = if s.ok() {
                GrpcCode::Ok
            } else {
                GrpcCode::Unknown
            };
            CriCall::new(method)
                .with_pod_uid(pod_uid)
                .with_container(container)
                .with_sandbox_id(text(s, "sandbox.id"))
                .with_container_id(text(s, "container.id"))
                .with_times(s.start_ns, s.end_ns)
                .with_code(code)
                .with_message(s.status_message.clone())
                .with_traced(true)
        })
        .collect();
    let call_of: HashMap<&str, usize> = servers
        .iter()
        .enumerate()
        .map(|(i, s)| (s.span_id.as_str(), i))
        .collect();
    let span_of: HashMap<&str, &RuntimeSpan> =
        spans.iter().map(|s| (s.span_id.as_str(), *s)).collect();
    let tied = spans
        .iter()
        .map(|s| {
            let mut cur = *s;
            for _ in 0..MAX_DEPTH {
                if let Some(&c) = call_of.get(cur.span_id.as_str()) {
                    return Some(c);
                }
                cur = span_of.get(cur.parent_span_id.as_str())?;
            }
            None
        })
        .collect();
    (calls, tied)
}

use podlapse_core::record::ids::hex;

/// One stage the runtime's spans make inside a call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuntimeStage {
    pub step: Step,
    pub start_ns: u64,
    pub end_ns: u64,
    pub ok: bool,
    /// The runtime's span names it was made of.
    pub detail: String,
}

/// The stages `spans` (those tied to `call`) make, in the order they start.
pub fn call_stages(call: &CriCall, spans: &[&RuntimeSpan]) -> Vec<RuntimeStage> {
    let (lo, hi) = (call.start_ns, call.end_ns.max(call.start_ns));
    let clamp = |t: u64| t.clamp(lo, hi);
    let by_id: HashMap<&str, &RuntimeSpan> =
        spans.iter().map(|s| (s.span_id.as_str(), *s)).collect();
    let mut out = Vec::new();
    for s in spans {
        let Some(step) = step_of(&s.name) else {
            continue;
        };
        // Part of an enclosing span of the same step?
        let mut folded = false;
        let mut cur = *s;
        for _ in 0..MAX_DEPTH {
            let Some(parent) = by_id.get(cur.parent_span_id.as_str()) else {
                break;
            };
            if step_of(&parent.name).is_some_and(|outer| step.folds_into(outer)) {
                folded = true;
                break;
            }
            cur = parent;
        }
        if !folded {
            out.push(RuntimeStage {
                step,
                start_ns: clamp(s.start_ns),
                end_ns: clamp(s.end_ns),
                ok: s.ok(),
                detail: s.name.clone(),
            });
        }
    }
    if call.method == CriMethod::RunPodSandbox {
        out.extend(sandbox_image_pull(spans, &clamp));
        out.extend(network_setup(spans, &clamp, hi));
    }
    out.sort_by_key(|s| (s.start_ns, s.step, s.end_ns));
    out
}

/// The sandbox image's pull inside RunPodSandbox: from the first to the last span of
/// image work.
fn sandbox_image_pull(spans: &[&RuntimeSpan], clamp: &dyn Fn(u64) -> u64) -> Option<RuntimeStage> {
    let work: Vec<&&RuntimeSpan> = spans.iter().filter(|s| is_image_work(&s.name)).collect();
    let start = work.iter().map(|s| s.start_ns).min()?;
    let end = work.iter().map(|s| s.end_ns).max()?;
    let mut names: Vec<&str> = work.iter().map(|s| s.name.as_str()).collect();
    names.sort_unstable();
    names.dedup();
    Some(RuntimeStage {
        step: Step::SandboxImagePull,
        start_ns: clamp(start),
        end_ns: clamp(end),
        ok: work.iter().all(|s| s.ok()),
        detail: format!("{} spans: {}", work.len(), names.join(", ")),
    })
}

/// The sandbox's network, from containerd's `setup pod network` event.
fn network_setup(
    spans: &[&RuntimeSpan],
    clamp: &dyn Fn(u64) -> u64,
    call_end: u64,
) -> Option<RuntimeStage> {
    let (holder, at) = spans.iter().find_map(|s| {
        s.events
            .iter()
            .find(|e| e.name == NETWORK_EVENT)
            .map(|e| (*s, e.at_ns))
    })?;
    let mut after: Vec<&&RuntimeSpan> = spans
        .iter()
        .filter(|s| s.start_ns >= at && s.span_id != holder.span_id)
        .collect();
    after.sort_by_key(|s| (s.start_ns, s.end_ns));
    let metadata: Vec<&&&RuntimeSpan> = after
        .iter()
        .filter(|s| s.name.starts_with("metadata."))
        .collect();
    let (end, how) = if let Some(saved) = metadata.get(1) {
        (saved.end_ns, "until the CNI result was saved")
    } else if let Some(next) = after.iter().find(|s| !s.name.starts_with("metadata.")) {
        (next.start_ns, "until the next step")
    } else {
        (holder.end_ns.min(call_end), "until the call's end")
    };
    Some(RuntimeStage {
        step: Step::NetworkSetup,
        start_ns: clamp(at),
        end_ns: clamp(end.max(at)),
        ok: true,
        detail: format!("from containerd's {NETWORK_EVENT:?} event {how}"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use podlapse_core::record::RuntimeSpanEvent;

    fn call(method: &str, start: u64, end: u64, traced: bool) -> CriCall {
        CriCall::new(method.parse().expect("a CRI method"))
            .with_pod_uid("uid")
            .with_times(start, end)
            .with_code(crate::cri::GrpcCode::Ok)
            .with_traced(traced)
    }

    fn span(id: &str, parent: &str, name: &str, start: u64, end: u64) -> RuntimeSpan {
        RuntimeSpan {
            pod_uid: "uid".into(),
            trace_id: "00".repeat(16),
            span_id: id.repeat(8),
            parent_span_id: if parent.len() == 2 {
                parent.repeat(8)
            } else {
                parent.to_string()
            },
            name: name.into(),
            kind: "internal".into(),
            start_ns: start,
            end_ns: end,
            attributes: Default::default(),
            events: Vec::new(),
            status: "unset".into(),
            status_message: String::new(),
            scope: String::new(),
            scope_version: String::new(),
            resource: Default::default(),
        }
    }

    #[test]
    fn containerd_span_names_map_to_a_small_vocabulary() {
        for (name, step) in [
            ("client.NewContainer", Some(Step::ContainerNew)),
            ("container.NewTask", Some(Step::TaskCreate)),
            ("containerd.task.v3.Task/Create", Some(Step::TaskCreate)),
            ("task.Start", Some(Step::TaskStart)),
            ("containerd.task.v3.Task/Start", Some(Step::TaskStart)),
            ("metadata.sandbox.Create", Some(Step::Metadata)),
            ("metadata.containers.Create", Some(Step::Metadata)),
            ("pull.fetch", Some(Step::ImageFetch)),
            ("pkg.unpack.unpacker.fetchLayer", Some(Step::ImageFetch)),
            ("pkg.unpack.unpacker.unpackLayer", Some(Step::ImageUnpack)),
            (
                "remotes.docker.resolver.HTTPRequest",
                Some(Step::ImageResolve),
            ),
            ("pull.Pull", None),
            ("pkg.unpack.unpacker.unpack", None),
            ("runtime.v1.RuntimeService/RunPodSandbox", None),
            ("task.Wait", None),
            ("containerd.task.v3.Task/Wait", None),
        ] {
            assert_eq!(step_of(name), step, "{name}");
        }
        assert_eq!(Step::NetworkSetup.name(), "network_setup");
    }

    #[test]
    fn a_span_belongs_to_the_call_its_chain_of_parents_reaches() {
        let run = call("RunPodSandbox", 100, 900, true);
        let untraced = call("PodSandboxStatus", 950, 960, false);
        let run_id = hex(&podlapse_core::record::ids::call_span_id(&run));
        let status_id = hex(&podlapse_core::record::ids::call_span_id(&untraced));
        let server = span(
            "01",
            &run_id,
            "runtime.v1.RuntimeService/RunPodSandbox",
            110,
            890,
        );
        let child = span("02", "01", "client.NewContainer", 300, 400);
        let grandchild = span("03", "02", "metadata.containers.Create", 310, 320);
        let lost = span("04", "0f", "task.Start", 500, 600);
        let under_untraced = span("05", &status_id, "x", 951, 952);
        let spans = [&grandchild, &server, &child, &lost, &under_untraced];
        let calls = [&run, &untraced];
        assert_eq!(
            attribute(&calls, &spans),
            vec![Some(0), Some(0), Some(0), None, None]
        );
        // A cycle ends, tied to nothing.
        let a = span("0a", "0b", "a", 1, 2);
        let b = span("0b", "0a", "b", 1, 2);
        assert_eq!(attribute(&calls, &[&a, &b]), vec![None, None]);
    }

    #[test]
    fn a_sandboxs_spans_make_its_pull_network_metadata_and_task_stages() {
        let run = call("RunPodSandbox", 1_000, 10_000, true);
        let mut server = span(
            "01",
            "ff",
            "runtime.v1.RuntimeService/RunPodSandbox",
            1_010,
            9_990,
        );
        server.events.push(RuntimeSpanEvent {
            name: NETWORK_EVENT.into(),
            at_ns: 1_500,
            attributes: Default::default(),
        });
        let spans = [
            server,
            span("02", "01", "metadata.sandbox.Create", 1_100, 1_200),
            span("03", "01", "metadata.sandbox.Update", 1_600, 1_650),
            span("04", "01", "metadata.sandbox.Update", 3_000, 3_100),
            span("05", "01", "pull.Pull", 3_500, 6_000),
            span(
                "06",
                "05",
                "remotes.docker.resolver.HTTPRequest",
                3_510,
                3_800,
            ),
            span("07", "05", "pkg.unpack.unpacker.fetchLayer", 3_900, 5_000),
            span(
                "08",
                "07",
                "remotes.docker.resolver.HTTPRequest",
                3_950,
                4_900,
            ),
            span("09", "05", "pkg.unpack.unpacker.unpackLayer", 5_000, 5_900),
            span("0a", "01", "client.NewContainer", 6_100, 6_500),
            span("0b", "01", "container.NewTask", 6_600, 8_000),
            span("0c", "0b", "containerd.task.v3.Task/Create", 7_000, 7_900),
            span("0d", "01", "task.Start", 8_100, 12_000),
        ];
        let refs: Vec<&RuntimeSpan> = spans.iter().collect();
        let stages = call_stages(&run, &refs);
        let got: Vec<(&str, u64, u64)> = stages
            .iter()
            .map(|s| (s.step.name(), s.start_ns, s.end_ns))
            .collect();
        assert_eq!(
            got,
            vec![
                ("metadata", 1_100, 1_200),
                ("network_setup", 1_500, 3_100),
                ("metadata", 1_600, 1_650),
                ("metadata", 3_000, 3_100),
                ("sandbox_image_pull", 3_500, 6_000),
                ("image_resolve", 3_510, 3_800),
                ("image_fetch", 3_900, 5_000),
                ("image_unpack", 5_000, 5_900),
                ("container_new", 6_100, 6_500),
                ("task_create", 6_600, 8_000),
                // Clamped into the call.
                ("task_start", 8_100, 10_000),
            ]
        );
        assert!(stages.iter().all(|s| s.ok));
        // A pull is RunPodSandbox's only; no event, no network stage.
        let pull = call("PullImage", 1_000, 10_000, true);
        let names: Vec<&str> = call_stages(&pull, &refs[1..])
            .iter()
            .map(|s| s.step.name())
            .collect();
        assert!(!names.contains(&"sandbox_image_pull"), "{names:?}");
        assert!(!names.contains(&"network_setup"), "{names:?}");
        assert!(names.contains(&"image_fetch"), "{names:?}");
    }

    #[test]
    fn network_setup_without_a_second_save_ends_at_the_next_step() {
        let run = call("RunPodSandbox", 0, 1_000, true);
        let mut server = span("01", "ff", "server", 0, 900);
        server.events.push(RuntimeSpanEvent {
            name: NETWORK_EVENT.into(),
            at_ns: 100,
            attributes: Default::default(),
        });
        let next = span("02", "01", "client.NewContainer", 400, 500);
        let s = call_stages(&run, &[&server, &next]);
        let net = s.iter().find(|s| s.step == Step::NetworkSetup).unwrap();
        assert_eq!((net.start_ns, net.end_ns), (100, 400));
        let s = call_stages(&run, &[&server]);
        let net = s.iter().find(|s| s.step == Step::NetworkSetup).unwrap();
        assert_eq!((net.start_ns, net.end_ns), (100, 900));
    }
}
