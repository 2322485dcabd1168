//! The report on hand-built timelines: shares that add up, the gap as its own row, the
//! nesting rule for overlapping stages, and a Perfetto export whose slices nest.

use super::*;
use crate::timeline::{Stage, StageSource, Timeline};

const MS: u64 = 1_000_000;

fn stage(name: &str, start_ms: u64, end_ms: u64, source: StageSource) -> Stage {
    Stage {
        pod_uid: "u1".into(),
        namespace: "default".into(),
        pod: "web".into(),
        stage: name.into(),
        start_ns: start_ms * MS,
        end_ns: end_ms * MS,
        duration_ns: (end_ms - start_ms) * MS,
        source,
        ok: true,
        exit_code: None,
        signal: None,
        code: None,
        sandbox_id: None,
        container: name.split_once(':').map(|(_, c)| c.to_string()),
        container_id: None,
        pid: None,
        netns_inum: None,
        cgroup_id: None,
        detail: String::new(),
        reply: None,
        capture: None,
    }
}

/// A pod like the lab's: RunPodSandbox 10..110 holding netns, CNI (bridge with
/// host-local inside it, loopback beside it), the shim's start and runc's create (with
/// init and the cgroups inside) and start, then pull, create, start with the same
/// runtime steps and the app's first exec inside the call.
fn pod() -> Timeline {
    use StageSource::{Agent, Cri, Kernel};
    let mut ipam = stage("cni_plugin:host-local", 50, 60, Kernel);
    ipam.detail = "ADD, delegated by bridge".into();
    let mut start = stage("container_start:app", 150, 190, Cri);
    start.container_id = Some("c1".into());
    let mut exec = stage("app_first_exec:app", 180, 180, Kernel);
    exec.container_id = Some("c1".into());
    Timeline::from_stages([
        stage("pod_seen", 0, 0, Agent),
        stage("admitted", 1, 1, Cri),
        stage("pod_cgroup_created", 2, 4, Kernel),
        stage("sandbox_requested", 10, 110, Cri),
        stage("netns_created", 20, 22, Kernel),
        stage("cni_add", 30, 80, Kernel),
        stage("cni_plugin:bridge", 30, 75, Kernel),
        stage("cni_plugin:loopback", 32, 40, Kernel),
        ipam,
        stage("cni_plugin:portmap", 76, 80, Kernel),
        stage("shim_start", 82, 86, Kernel),
        stage("runc_create", 87, 99, Kernel),
        stage("runc_init", 89, 97, Kernel),
        stage("sandbox_cgroup", 90, 95, Kernel),
        stage("runc_start", 100, 104, Kernel),
        stage("pause_exec", 105, 105, Kernel),
        stage("sandbox_ready", 112, 113, Cri),
        stage("image_pull:app", 120, 130, Cri),
        stage("container_create:app", 135, 145, Cri),
        start,
        stage("shim_start:app", 152, 155, Kernel),
        stage("runc_create:app", 156, 170, Kernel),
        stage("runc_init:app", 158, 168, Kernel),
        stage("container_cgroup:app", 160, 165, Kernel),
        stage("runc_start:app", 172, 178, Kernel),
        exec,
        stage("running", 190, 190, Cri),
        stage("ready", 190, 190, Cri),
    ])
}

fn input(t: Timeline) -> TraceInput {
    TraceInput {
        name: "t.jsonl".into(),
        records: Vec::new(),
        timeline: t,
    }
}

fn part<'a>(b: &'a Breakdown, name: &str) -> &'a Part {
    b.parts
        .iter()
        .find(|p| p.part == name)
        .unwrap_or_else(|| panic!("no part {name}: {:#?}", b.parts))
}

#[test]
fn the_parts_and_the_gap_add_up_to_the_startup() {
    let t = pod();
    let b = breakdown(&t.pods[0]).unwrap();
    assert_eq!(b.total_ns, 190 * MS);
    assert_eq!(b.end, "running");
    assert_eq!(b.parts.iter().map(|p| p.ns).sum::<u64>(), b.total_ns);
    let shares: f64 = b.parts.iter().map(|p| p.share).sum();
    assert!((shares - 100.0).abs() < 1e-9, "{shares}");
    // The most specific stage running takes each instant.
    assert_eq!(part(&b, "cni_plugin:host-local").ns, 10 * MS);
    assert_eq!(part(&b, "cni_plugin:loopback").ns, 8 * MS);
    // bridge 30..75 less loopback 32..40 and host-local 50..60.
    assert_eq!(part(&b, "cni_plugin:bridge").ns, 27 * MS);
    assert_eq!(part(&b, "cni_plugin:portmap").ns, 4 * MS);
    // cni_add 30..80 less its plugins: 75..76.
    assert_eq!(part(&b, "cni_add").ns, MS);
    assert_eq!(part(&b, "netns_created").ns, 2 * MS);
    // RunPodSandbox 10..110 less netns (2), CNI (50), the shim's start (4), runc create
    // (12) and start (4): the runtime's own.
    assert_eq!(part(&b, "runtime_sandbox").ns, 28 * MS);
    assert!(part(&b, "runtime_sandbox").opaque);
    // runc create 87..99 less init 89..97; init less the cgroups 90..95.
    assert_eq!(part(&b, "runc_create").ns, 4 * MS);
    assert_eq!(part(&b, "runc_init").ns, 3 * MS);
    assert_eq!(part(&b, "sandbox_cgroup").ns, 5 * MS);
    assert!(!part(&b, "runc_create").opaque);
    // StartContainer 150..190 less shim (3), create (14) and start (6); the app's exec
    // inside the call takes nothing.
    assert_eq!(part(&b, "container_start:app").ns, 17 * MS);
    assert_eq!(part(&b, "runc_init:app").ns, 5 * MS);
    assert!(b.parts.iter().all(|p| p.part != "app_first_exec:app"));
    assert_eq!(b.largest_opaque().unwrap().part, "runtime_sandbox");
    // 0..2, 4..10, 110..112, 113..120, 130..135, 145..150.
    let gap = b.parts.last().unwrap();
    assert_eq!(gap.part, GAP);
    assert_eq!(gap.ns, 27 * MS);
    assert!((gap.share - 27.0 * 100.0 / 190.0).abs() < 1e-9);
    // Rows in the order they first took time, the gap last.
    let names: Vec<&str> = b.parts.iter().map(|p| p.part.as_str()).collect();
    assert_eq!(
        names,
        [
            "pod_cgroup_created",
            "runtime_sandbox",
            "netns_created",
            "cni_plugin:bridge",
            "cni_plugin:loopback",
            "cni_plugin:host-local",
            "cni_add",
            "cni_plugin:portmap",
            "shim_start",
            "runc_create",
            "runc_init",
            "sandbox_cgroup",
            "runc_start",
            "sandbox_ready",
            "image_pull:app",
            "container_create:app",
            "container_start:app",
            "shim_start:app",
            "runc_create:app",
            "runc_init:app",
            "container_cgroup:app",
            "runc_start:app",
            GAP
        ]
    );
}

#[test]
fn a_held_update_takes_only_time_no_work_covers() {
    let mut t = pod();
    // An update held from 170 (inside StartContainer, 150..190) until after Running:
    // the call keeps its time, the wait takes nothing inside the startup.
    let held = stage("pod_worker_wait", 170, 195, StageSource::Agent);
    t.pods[0].stages.push(held);
    let b = breakdown(&t.pods[0]).unwrap();
    assert_eq!(part(&b, "container_start:app").ns, 17 * MS);
    assert!(
        b.parts.iter().all(|p| p.part != "pod_worker_wait"),
        "{b:#?}"
    );
    // Held across a stretch nothing covers (110..112, between the sandbox's return and
    // its status read), it takes that stretch from the gap.
    let mut t = pod();
    t.pods[0]
        .stages
        .push(stage("pod_worker_wait", 105, 112, StageSource::Agent));
    let b = breakdown(&t.pods[0]).unwrap();
    assert_eq!(part(&b, "pod_worker_wait").ns, 2 * MS);
    assert_eq!(b.gap().unwrap().ns, 25 * MS);
    assert_eq!(part(&b, "runtime_sandbox").ns, 28 * MS);
}

#[test]
fn readiness_after_running_extends_the_startup() {
    let mut t = pod();
    let ready = t.pods[0]
        .stages
        .iter_mut()
        .find(|s| s.stage == "ready")
        .unwrap();
    ready.start_ns = 250 * MS;
    ready.end_ns = 250 * MS;
    let b = breakdown(&t.pods[0]).unwrap();
    assert_eq!((b.total_ns, b.end.as_str()), (250 * MS, "ready"));
    assert_eq!(part(&b, "ready").ns, 60 * MS);
    assert_eq!(b.parts.iter().map(|p| p.ns).sum::<u64>(), b.total_ns);
}

#[test]
fn a_pod_that_never_ran_has_no_breakdown_but_an_outcome() {
    let mut failed = stage("sandbox_requested", 10, 20, StageSource::Cri);
    failed.ok = false;
    let t = Timeline::from_stages([stage("pod_seen", 0, 0, StageSource::Agent), failed]);
    let r = build(&[input(t)]);
    assert!(r.pods[0].breakdown.is_none());
    assert_eq!(
        r.pods[0].outcome.as_deref(),
        Some(
            "did not reach Running; last stage sandbox_requested; first failure sandbox_requested"
        )
    );
    assert_eq!(r.stages[0].stage, "sandbox_requested");
    assert_eq!((r.stages[0].count, r.stages[0].failed), (1, 1));
}

#[test]
fn stage_rows_pool_containers_and_keep_plugins_apart() {
    let r = build(&[input(pod()), input(pod())]);
    let names: Vec<&str> = r.stages.iter().map(|s| s.stage.as_str()).collect();
    assert_eq!(
        names,
        [
            "pod_cgroup_created",
            "sandbox_requested",
            "netns_created",
            "cni_add",
            "cni_plugin:bridge",
            "cni_plugin:host-local",
            "cni_plugin:loopback",
            "cni_plugin:portmap",
            "sandbox_ready",
            "image_pull",
            "container_create",
            "container_start",
            "shim_start",
            "runc_create",
            "runc_init",
            "sandbox_cgroup",
            "container_cgroup",
            "runc_start",
            STARTUP,
            TO_READY
        ]
    );
    let startup = r.stages.iter().find(|s| s.stage == STARTUP).unwrap();
    assert_eq!(
        (startup.count, startup.p50_ns, startup.max_ns),
        (2, 190 * MS, 190 * MS)
    );
    // The same input gives the same text.
    assert_eq!(table(&r), table(&build(&[input(pod()), input(pod())])));
}

#[test]
fn the_chrome_json_export_nests_every_threads_slices() {
    let doc = chrome_trace(&[input(pod())]);
    let events = doc["traceEvents"].as_array().unwrap();
    let slices: Vec<&serde_json::Value> = events.iter().filter(|e| e["ph"] == "X").collect();
    assert_eq!(slices.len(), pod().pods[0].stages.len());
    // Perfetto's importer needs every slice on a thread to lie inside the one open
    // around it or after it ended.
    let mut by_tid: std::collections::BTreeMap<u64, Vec<(f64, f64)>> = Default::default();
    for s in &slices {
        let ts = s["ts"].as_f64().unwrap();
        let dur = s["dur"].as_f64().unwrap();
        by_tid
            .entry(s["tid"].as_u64().unwrap())
            .or_default()
            .push((ts, ts + dur));
    }
    for (tid, spans) in by_tid {
        let mut open: Vec<f64> = Vec::new();
        for (start, end) in spans {
            while open.last().is_some_and(|e| *e <= start) {
                open.pop();
            }
            assert!(
                open.last().is_none_or(|e| end <= *e),
                "thread {tid}: {start}..{end} crosses its parent"
            );
            open.push(end);
        }
    }
    let bridge = slices
        .iter()
        .find(|s| s["name"] == "cni_plugin:bridge")
        .unwrap();
    assert_eq!(bridge["dur"], 45_000.0);
    assert_eq!(bridge["cat"], "kernel");
}

#[test]
fn overlapping_stages_go_on_a_second_thread() {
    use StageSource::Kernel;
    let t = Timeline::from_stages([
        stage("pod_seen", 0, 0, StageSource::Agent),
        stage("cni_plugin:loopback", 10, 20, Kernel),
        stage("cni_plugin:bridge", 15, 40, Kernel),
    ]);
    let doc = chrome_trace(&[input(t)]);
    let tid = |name: &str| {
        doc["traceEvents"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["name"] == name)
            .unwrap()["tid"]
            .as_u64()
            .unwrap()
    };
    assert_eq!(tid("cni_plugin:loopback"), 100);
    assert_eq!(tid("cni_plugin:bridge"), 101);
    let threads: Vec<&str> = doc["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["name"] == "thread_name")
        .map(|e| e["args"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(threads, ["stages", "stages (overlapping 1)"]);
}

#[test]
fn the_svg_parses_and_draws_every_stage_and_sample() {
    let text = svg(&[input(pod())], None);
    let mut rects = 0;
    let mut instants = 0;
    let mut samples = 0;
    let mut texts = Vec::new();
    let mut in_text = false;
    for event in ::svg::read(&text).unwrap() {
        match event {
            ::svg::parser::Event::Error(e) => panic!("{e}"),
            ::svg::parser::Event::Tag(name, kind, attrs) => {
                let class = attrs.get("class").map(|v| v.to_string());
                match (name, class.as_deref()) {
                    ("rect", Some("stage")) => rects += 1,
                    ("polygon", Some("instant")) => instants += 1,
                    ("circle", Some("sample")) => samples += 1,
                    _ => {}
                }
                in_text = name == "text" && kind == ::svg::node::element::tag::Type::Start;
            }
            ::svg::parser::Event::Text(t) if in_text => texts.push(t.to_string()),
            _ => {}
        }
    }
    let stages = &pod().pods[0].stages;
    assert_eq!(rects, stages.iter().filter(|s| s.duration_ns > 0).count());
    assert_eq!(
        instants,
        stages.iter().filter(|s| s.duration_ns == 0).count()
    );
    // Every span stage's duration, plus the startup and Ready rows.
    assert_eq!(
        samples,
        stages.iter().filter(|s| s.duration_ns > 0).count() + 2
    );
    assert!(
        texts.iter().any(|t| t.contains("Waterfall: default/web")),
        "{texts:?}"
    );
    assert!(
        texts.iter().any(|t| t == "cni_plugin:host-local"),
        "{texts:?}"
    );
}

/// A stage of the runtime's own spans, of the sandbox (`container` None) or a container.
fn runtime(step: &str, container: Option<&str>, start_ms: u64, end_ms: u64) -> Stage {
    let name = match container {
        Some(c) => format!("runtime:{step}:{c}"),
        None => format!("runtime:{step}"),
    };
    let mut s = stage(&name, start_ms, end_ms, StageSource::Runtime);
    s.container = container.map(str::to_string);
    s
}

#[test]
fn the_runtimes_spans_take_from_the_calls_remainder_and_leave_the_kernels_stages_theirs() {
    let mut stages = pod().pods.remove(0).stages;
    stages.extend([
        runtime("metadata", None, 12, 14),
        // Around the netns and every CNI plugin run.
        runtime("network_setup", None, 18, 81),
        // Around the shim's start and runc create; task.Start around runc start.
        runtime("task_create", None, 81, 100),
        runtime("task_start", None, 100, 106),
        runtime("task_start", Some("app"), 151, 189),
        // The sandbox image's pull, whose first span (a registry request) starts with it
        // and ends first: the request is the more specific.
        runtime("image_resolve", None, 106, 107),
        runtime("sandbox_image_pull", None, 106, 108),
    ]);
    stages.sort_by_key(|s| s.start_ns);
    let t = Timeline::from_stages(stages);
    let b = breakdown(&t.pods[0]).unwrap();
    assert_eq!(b.parts.iter().map(|p| p.ns).sum::<u64>(), b.total_ns);
    let shares: f64 = b.parts.iter().map(|p| p.share).sum();
    assert!((shares - 100.0).abs() < 1e-9, "{shares}");
    // The kernel's stages keep every instant they had.
    assert_eq!(part(&b, "netns_created").ns, 2 * MS);
    assert_eq!(part(&b, "cni_plugin:bridge").ns, 27 * MS);
    assert_eq!(part(&b, "shim_start").ns, 4 * MS);
    assert_eq!(part(&b, "runc_create").ns, 4 * MS);
    assert_eq!(part(&b, "runc_start").ns, 4 * MS);
    // network_setup 18..81 less netns 20..22 and CNI 30..80.
    assert_eq!(part(&b, "runtime:network_setup").ns, 11 * MS);
    // task_create 81..100 less the shim 82..86 and runc create 87..99.
    assert_eq!(part(&b, "runtime:task_create").ns, 3 * MS);
    // task_start 100..106 less runc start 100..104 (it starts with it, and is the later
    // step).
    assert_eq!(part(&b, "runtime:task_start").ns, 2 * MS);
    assert_eq!(part(&b, "runtime:metadata").ns, 2 * MS);
    assert_eq!(part(&b, "runtime:image_resolve").ns, MS);
    assert_eq!(part(&b, "runtime:sandbox_image_pull").ns, MS);
    // RunPodSandbox's remainder was 28 ms; the runtime's spans explain 20 of it.
    assert_eq!(part(&b, "runtime_sandbox").ns, 8 * MS);
    assert!(!part(&b, "runtime:network_setup").opaque);
    // StartContainer 150..190: 17 ms left before, task.Start explains 15 of them.
    assert_eq!(part(&b, "runtime:task_start:app").ns, 15 * MS);
    assert_eq!(part(&b, "container_start:app").ns, 2 * MS);
    assert!(part(&b, "runtime:task_start:app").what.contains("for app"));
    // The gap is the same: the runtime's spans lie inside calls.
    assert_eq!(b.gap().unwrap().ns, 27 * MS);
    // CreateContainer had no span of the runtime's inside it: said so.
    assert_eq!(
        b.notes,
        ["container_create:app not broken down: the runtime sent no spans inside these calls"]
    );
    let text = table(&build(&[input(t)]));
    assert!(
        text.contains("note: container_create:app not broken down"),
        "{text}"
    );
}

#[test]
fn without_the_runtimes_spans_the_report_says_which_parts_it_could_not_name_and_why() {
    let b = breakdown(&pod().pods[0]).unwrap();
    assert_eq!(
        b.notes,
        [
            "runtime_sandbox, container_create:app, container_start:app not broken down: the \
             runtime sent no spans (no --runtime-otlp-listen, or a runtime without tracing)"
        ]
    );
    let md = markdown(&build(&[input(pod())]));
    assert!(md.contains("Note: runtime_sandbox, "), "{md}");
}

#[test]
fn runtime_steps_pool_across_containers_in_the_stage_table() {
    let mut stages = pod().pods.remove(0).stages;
    stages.extend([
        runtime("task_start", None, 100, 106),
        runtime("task_start", Some("app"), 151, 189),
    ]);
    let t = Timeline::from_stages(stages);
    let r = build(&[input(t)]);
    let row = r
        .stages
        .iter()
        .find(|s| s.stage == "runtime:task_start")
        .unwrap();
    assert_eq!(row.count, 2);
    assert_eq!(row.max_ns, 38 * MS);
}

/// `pod()` renamed and slowed: its Running comes `extra_ms` later.
fn slower_pod(name: &str, uid: &str, extra_ms: u64) -> Timeline {
    let mut t = pod();
    for p in &mut t.pods {
        p.name = name.into();
        p.uid = uid.into();
        for s in &mut p.stages {
            s.pod = name.into();
            s.pod_uid = uid.into();
            if s.stage == "running" {
                s.start_ns += extra_ms * MS;
                s.end_ns += extra_ms * MS;
            }
        }
    }
    t
}

fn waterfall_title(text: &str) -> String {
    let start = text.find("Waterfall: ").expect("a waterfall title");
    text[start..].split('<').next().unwrap().to_string()
}

#[test]
fn the_svg_draws_the_slowest_pod_unless_told_which_above_every_pods_distributions() {
    let mut fast = pod();
    fast.pods.extend(slower_pod("slow", "u2", 500).pods);
    fast.pods.extend(slower_pod("middle", "u3", 100).pods);
    let inputs = [input(fast)];
    let text = svg(&inputs, None);
    assert!(
        waterfall_title(&text).contains("default/slow "),
        "{}",
        waterfall_title(&text)
    );
    assert!(
        text.contains("across 3 pods"),
        "the distributions cover every pod"
    );
    let text = svg(&inputs, Some("default/middle"));
    assert!(
        waterfall_title(&text).contains("default/middle "),
        "{}",
        waterfall_title(&text)
    );
    assert!(
        text.contains("across 3 pods"),
        "choosing the waterfall narrows nothing else"
    );
}
