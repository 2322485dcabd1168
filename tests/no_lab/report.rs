//! `podlapse report` and `podlapse diagnose` on the recorded fixtures in traces/: the
//! stage table, breakdowns whose shares are the recorded numbers and add up with the
//! gap, the Perfetto (Chrome JSON) export checked against the trace-event format's rules
//! and read back, the SVG, and the verdicts. Needs no lab.
//!
//! Perfetto's own trace processor is not used: the `perfetto` package on PyPI does not
//! ship its `trace_processor_shell` binary but downloads it on first use, and nothing
//! outside the package registries is reachable where these tests run. The export is
//! instead held to the rules Perfetto's JSON importer applies (complete and instant
//! events with the fields it reads, slices on one thread properly nested) and read back
//! to the same stages, names, counts and durations.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use podlapse::diagnose::{Cause, Diagnosis};
use podlapse::report::Report;
use podlapse::timeline::Timeline;
use podlapse::trace::{TraceRecord, read_trace};
use podlapse_tests::{fixtures, podlapse_bin, stderr, stdout, workspace_root};
use serde_json::Value;

fn fixture(name: &str) -> PathBuf {
    workspace_root().join("traces").join(name)
}

fn podlapse(args: &[&str]) -> Output {
    Command::new(podlapse_bin())
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("running {}: {e}", podlapse_bin().display()))
}

fn report(extra: &[&str], traces: &[PathBuf]) -> Output {
    let mut args = vec!["report"];
    args.extend_from_slice(extra);
    let paths: Vec<String> = traces.iter().map(|p| p.display().to_string()).collect();
    args.extend(paths.iter().map(String::as_str));
    let out = podlapse(&args);
    assert!(out.status.success(), "{}", stderr(&out));
    out
}

fn timeline(trace: &Path) -> Timeline {
    let out = podlapse(&["timeline", trace.to_str().unwrap(), "-o", "json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    serde_json::from_slice(&out.stdout).expect("timeline JSON")
}

#[test]
fn the_report_on_the_fixtures_gives_the_stage_table_and_every_pods_breakdown() {
    let traces = fixtures();
    let out = report(&[], &traces);
    let text = stdout(&out);
    eprintln!("{text}");
    let lines: Vec<&str> = text.lines().collect();
    assert!(
        lines[0].starts_with(&format!("{} traces, ", traces.len())),
        "{text}"
    );
    assert!(
        lines[2].split_whitespace().collect::<Vec<_>>()
            == [
                "STAGE", "COUNT", "FAILED", "P50", "ms", "P90", "ms", "P99", "ms", "MAX", "ms"
            ],
        "{text}"
    );
    for stage in [
        "sandbox_requested",
        "netns_created",
        "cni_add",
        "cni_plugin:bridge",
        "cni_plugin:host-local",
        "cni_plugin:tuning",
        "image_pull",
        "container_create",
        "container_start",
        "pod_startup",
    ] {
        assert!(
            lines.iter().any(|l| l.starts_with(&format!("{stage} "))),
            "no {stage} row:\n{text}"
        );
    }
    assert!(text.contains("  gap  "), "{text}");
    assert_eq!(text, stdout(&report(&[], &traces)), "not deterministic");

    // The JSON form: the figures are the recorded ones.
    let r: Report = serde_json::from_slice(&report(&["-o", "json"], &traces).stdout).unwrap();
    let mut pods = 0;
    for path in &traces {
        let name = path.file_name().unwrap().to_str().unwrap();
        for t in timeline(path).pods {
            pods += 1;
            let p = r
                .pods
                .iter()
                .find(|p| p.trace == name && p.uid == t.uid)
                .unwrap_or_else(|| panic!("{} of {name} not in the report", t.name));
            let Some(b) = &p.breakdown else {
                assert!(
                    t.stage("running").is_none(),
                    "{} ran but has no breakdown",
                    t.name
                );
                continue;
            };
            let running = t.stage("running").unwrap().start_ns;
            assert_eq!(b.total_ns, running - t.seen_ns.unwrap(), "{}", t.name);
            assert_eq!(b.parts.iter().map(|x| x.ns).sum::<u64>(), b.total_ns);
            let shares: f64 = b.parts.iter().map(|x| x.share).sum();
            assert!(
                (shares - 100.0).abs() < 1e-9,
                "{}: shares add to {shares}",
                t.name
            );
            let gap = b.parts.last().unwrap();
            assert_eq!(gap.part, "gap");
            // portmap runs alone, after bridge: its part is its recorded duration.
            let portmap = t.stage("cni_plugin:portmap").unwrap();
            let part = b
                .parts
                .iter()
                .find(|x| x.part == "cni_plugin:portmap")
                .unwrap();
            assert_eq!(part.ns, portmap.duration_ns, "{}", t.name);
            assert_eq!(
                part.share,
                portmap.duration_ns as f64 * 100.0 / b.total_ns as f64
            );
        }
    }
    assert_eq!(r.pods.len(), pods);
    let pull = r.stages.iter().find(|s| s.stage == "image_pull").unwrap();
    assert!(pull.failed >= 3, "{pull:?}");
    assert!(pull.p50_ns <= pull.p90_ns && pull.p90_ns <= pull.p99_ns && pull.p99_ns <= pull.max_ns);

    let md = stdout(&report(&["-o", "markdown"], &traces));
    assert!(
        md.contains("| stage | count | failed | p50 ms | p90 ms | p99 ms | max ms |"),
        "{md}"
    );
    assert!(md.contains("| `gap` |"), "{md}");
}

#[test]
fn the_report_narrows_to_one_pod() {
    let out = report(&["--pod", "web"], &[fixture("multi-container.jsonl")]);
    let text = stdout(&out);
    assert!(
        text.starts_with("1 trace, 1 pod (1 reached Running)"),
        "{text}"
    );
    let missing = podlapse(&[
        "report",
        "--pod",
        "nope",
        fixture("deletion.jsonl").to_str().unwrap(),
    ]);
    assert_eq!(missing.status.code(), Some(1), "{}", stderr(&missing));
}

/// Microseconds (the format's unit) to nanoseconds.
fn ns(us: &Value) -> u64 {
    (us.as_f64().expect("a number") * 1000.0).round() as u64
}

#[test]
fn the_chrome_json_export_follows_the_trace_event_format_and_reads_back_to_the_stages() {
    for name in ["multi-container.jsonl", "cni-failure.jsonl"] {
        let path = fixture(name);
        let doc: Value = serde_json::from_slice(
            &report(&["-o", "chrome-json"], std::slice::from_ref(&path)).stdout,
        )
        .expect("the export is JSON");
        let events = doc["traceEvents"].as_array().expect("a traceEvents array");
        assert_eq!(doc["displayTimeUnit"], "ms");
        let mut process_names: BTreeMap<u64, String> = BTreeMap::new();
        let mut thread_names: BTreeMap<u64, (u64, String)> = BTreeMap::new();
        let mut slices: BTreeMap<u64, Vec<&Value>> = BTreeMap::new();
        let mut instants = Vec::new();
        for e in events {
            let ph = e["ph"].as_str().expect("every event has a phase");
            let pid = e["pid"].as_u64().expect("every event has an integer pid");
            let tid = e["tid"].as_u64().expect("every event has an integer tid");
            assert!(e["name"].is_string(), "{e}");
            match ph {
                "M" => {
                    let n = e["args"]["name"].as_str();
                    match e["name"].as_str().unwrap() {
                        "process_name" => {
                            process_names.insert(pid, n.unwrap().to_string());
                        }
                        "thread_name" => {
                            // A tid names one thread of one process.
                            let old = thread_names.insert(tid, (pid, n.unwrap().to_string()));
                            assert!(old.is_none(), "tid {tid} named twice");
                        }
                        "process_sort_index" => assert!(e["args"]["sort_index"].is_u64()),
                        other => panic!("unexpected metadata {other}"),
                    }
                }
                "X" => {
                    assert!(e["ts"].as_f64().is_some_and(|t| t >= 0.0), "{e}");
                    assert!(e["dur"].as_f64().is_some_and(|d| d >= 0.0), "{e}");
                    slices.entry(tid).or_default().push(e);
                }
                "i" => {
                    assert_eq!(e["s"], "t", "instants are thread-scoped: {e}");
                    assert!(e["ts"].as_f64().is_some_and(|t| t >= 0.0), "{e}");
                    instants.push(e);
                }
                other => panic!("unexpected phase {other}: {e}"),
            }
        }
        // Every thread that carries events is named, within its process.
        for (tid, v) in &slices {
            let (pid, _) = &thread_names[tid];
            assert!(v.iter().all(|e| e["pid"] == *pid));
            assert!(process_names.contains_key(pid));
        }
        // Complete events on one thread nest: each starts after its parent and ends
        // before it ends, in the order the importer sorts them (time, longest first).
        for (tid, v) in &slices {
            let mut sorted: Vec<(u64, u64)> =
                v.iter().map(|e| (ns(&e["ts"]), ns(&e["dur"]))).collect();
            sorted.sort_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)));
            let mut open: Vec<u64> = Vec::new();
            for (start, dur) in sorted {
                while open.last().is_some_and(|end| *end <= start) {
                    open.pop();
                }
                assert!(
                    open.last().is_none_or(|end| start + dur <= *end),
                    "{name}: a slice on thread {tid} crosses its parent's end"
                );
                open.push(start + dur);
            }
        }
        if name == "cni-failure.jsonl" {
            // Its second attempt's loopback starts before bridge and ends inside it: the
            // two cannot nest, so one goes on a thread of its own.
            assert!(
                thread_names
                    .values()
                    .any(|(_, n)| n == "stages (overlapping 1)"),
                "{thread_names:?}"
            );
        }
        // Read back: per pod, the slices are the timeline's stages.
        let t = timeline(&path);
        for p in &t.pods {
            let pid = *process_names
                .iter()
                .find(|(_, n)| n.starts_with(&format!("{}/{} ", p.namespace, p.name)))
                .unwrap_or_else(|| panic!("no process for {}", p.name))
                .0;
            let mut got: Vec<(String, u64, u64)> = slices
                .values()
                .flatten()
                .filter(|e| e["pid"] == pid)
                .map(|e| {
                    (
                        e["name"].as_str().unwrap().to_string(),
                        ns(&e["ts"]),
                        ns(&e["dur"]),
                    )
                })
                .collect();
            let mut want: Vec<(String, u64, u64)> = p
                .stages
                .iter()
                .map(|s| (s.stage.to_string(), s.start_ns, s.duration_ns))
                .collect();
            got.sort();
            want.sort();
            assert_eq!(got, want, "{name}: {}", p.name);
        }
        // Kernel events are instants on the same clock: every one is there, and a
        // plugin's slice starts at the very instant its exec was seen.
        let trace = read_trace(&path).unwrap();
        let kernel = trace
            .records
            .iter()
            .filter(|r| matches!(r, TraceRecord::Kernel(_)))
            .count();
        assert_eq!(instants.len(), kernel, "{name}");
        let bridge = slices
            .values()
            .flatten()
            .find(|e| e["name"] == "cni_plugin:bridge")
            .unwrap();
        assert!(
            instants
                .iter()
                .any(|i| i["name"] == "cni ADD bridge" && ns(&i["ts"]) == ns(&bridge["ts"])),
            "{name}: no instant at bridge's start"
        );
    }
}

#[test]
fn the_svg_parses_and_draws_the_waterfall_and_the_distributions() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("report.svg");
    let traces = fixtures();
    let mut args = vec!["--svg", file.to_str().unwrap()];
    args.push("-o");
    args.push("json");
    let r: Report = serde_json::from_slice(&report(&args, &traces).stdout).unwrap();
    let text = std::fs::read_to_string(&file).expect("the SVG was written");
    let mut counts: BTreeMap<String, usize> = BTreeMap::new();
    let mut texts = Vec::new();
    let mut root = None;
    let mut in_text = false;
    for event in svg::read(&text).expect("the SVG parses") {
        match event {
            svg::parser::Event::Error(e) => panic!("the SVG does not parse: {e}"),
            svg::parser::Event::Tag(name, kind, attrs) => {
                if name == "svg" && root.is_none() {
                    root = Some((
                        attrs.get("width").map(|v| v.to_string()),
                        attrs.get("viewBox").map(|v| v.to_string()),
                    ));
                }
                if let Some(class) = attrs.get("class") {
                    *counts.entry(format!("{name}.{class}")).or_default() += 1;
                }
                in_text = name == "text" && kind == svg::node::element::tag::Type::Start;
            }
            svg::parser::Event::Text(t) if in_text => texts.push(t.to_string()),
            _ => {}
        }
    }
    let (width, view_box) = root.expect("an <svg> root");
    assert!(width.is_some() && view_box.is_some());
    // The waterfall is of the slowest pod to Running across the traces (the first of
    // equals), drawn until it was Running.
    let timelines: Vec<Timeline> = traces.iter().map(|t| timeline(t)).collect();
    let p = timelines
        .iter()
        .flat_map(|t| &t.pods)
        .filter_map(|p| Some((p.to_running_ns()?, p)))
        .reduce(|slowest, next| if next.0 > slowest.0 { next } else { slowest })
        .map(|(_, p)| p)
        .expect("a fixture pod reached Running");
    let until = p.stage("running").unwrap().start_ns;
    let drawn = p.stages.iter().filter(|s| s.start_ns <= until);
    let (spans, instants) = drawn.fold((0, 0), |(a, b), s| {
        if s.duration_ns > 0 {
            (a + 1, b)
        } else {
            (a, b + 1)
        }
    });
    assert_eq!(
        counts.get("rect.stage").copied().unwrap_or(0),
        spans,
        "{counts:?}"
    );
    assert_eq!(
        counts.get("polygon.instant").copied().unwrap_or(0),
        instants,
        "{counts:?}"
    );
    // One dot per recorded value, one box per stage row.
    let samples: usize = r.stages.iter().map(|s| s.count).sum();
    assert_eq!(counts["circle.sample"], samples, "{counts:?}");
    assert_eq!(counts["rect.box"], r.stages.len(), "{counts:?}");
    assert!(
        texts
            .iter()
            .any(|t| t.starts_with(&format!("Waterfall: {}/{} ", p.namespace, p.name))),
        "{texts:?}"
    );
    assert!(
        texts.iter().any(|t| t.starts_with("Stage latency across")),
        "{texts:?}"
    );
    for s in &r.stages {
        assert!(texts.contains(&s.stage), "no row for {}", s.stage);
    }
}

#[test]
fn diagnose_names_each_fixtures_failing_stage() {
    let diagnose = |name: &str| -> (Option<i32>, Diagnosis) {
        let out = podlapse(&["diagnose", fixture(name).to_str().unwrap(), "-o", "json"]);
        let d = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("{name}: {e}: {}", stderr(&out)));
        (out.status.code(), d)
    };
    let (code, d) = diagnose("cni-failure.jsonl");
    let v = &d.pods[0].verdict;
    assert_eq!(
        (code, v.cause, v.stage.to_string().as_str()),
        (Some(1), Cause::CniPluginFailed, "cni_plugin:tuning"),
        "{d:#?}"
    );
    assert!(v.summary.contains("exited with code 1"), "{v:#?}");
    assert!(
        v.evidence
            .iter()
            .any(|e| e.contains("invalid net sysctl key")),
        "{v:#?}"
    );

    let (_, d) = diagnose("crash-loop.jsonl");
    let v = &d.pods[0].verdict;
    assert_eq!(
        (v.cause, v.stage.to_string().as_str()),
        (Cause::CrashLoop, "container_start:app"),
        "{d:#?}"
    );
    assert!(v.summary.contains("exit code 1"), "{v:#?}");

    let (_, d) = diagnose("image-pull-backoff.jsonl");
    let v = &d.pods[0].verdict;
    assert_eq!(
        (v.cause, v.stage.to_string().as_str()),
        (Cause::ImagePullFailed, "image_pull:app"),
        "{d:#?}"
    );
    assert!(v.evidence.iter().any(|e| e.contains("NotFound")), "{v:#?}");

    for name in [
        "deletion.jsonl",
        "init-containers.jsonl",
        "multi-container.jsonl",
    ] {
        let (code, d) = diagnose(name);
        assert_eq!(code, Some(0), "{name}: {d:#?}");
        for p in &d.pods {
            assert_eq!(p.verdict.cause, Cause::Healthy, "{name}: {p:#?}");
            assert!(p.also.is_empty(), "{name}: {p:#?}");
        }
    }
    let table = podlapse(&["diagnose", fixture("cni-failure.jsonl").to_str().unwrap()]);
    assert!(
        stdout(&table).contains("cni_plugin_failed  stage cni_plugin:tuning: CNI plugin tuning exited with code 1 during ADD"),
        "{}",
        stdout(&table)
    );
}

#[test]
fn an_svg_pod_the_traces_do_not_hold_is_refused_by_name_and_nothing_is_drawn() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("report.svg");
    let out = podlapse(&[
        "report",
        fixture("cni-failure.jsonl").to_str().unwrap(),
        "--svg",
        file.to_str().unwrap(),
        "--svg-pod",
        "no-such-pod",
    ]);
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(
        err.contains("--svg-pod") && err.contains("no-such-pod") && err.contains("the pods are"),
        "{err}"
    );
    assert!(
        !file.exists(),
        "an SVG was drawn for a pod that is not there"
    );
}
