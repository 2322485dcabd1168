//! The CI gate: every fixture in traces/ was recorded on the lab from a scenario in
//! traces/scenarios/; each is valid against the schema, replays through the reconciler with
//! no divergence, replays to identical bytes twice, and a deliberately changed decision is
//! caught at the right call. Bad input is refused with the file and line. No lab needed.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use podlapse_tests::{fixtures, podlapse_bin, stderr, stdout, workspace_root};

fn replay(args: &[&str], traces: &[&Path]) -> Output {
    Command::new(podlapse_bin())
        .arg("replay")
        .args(args)
        .args(traces)
        .output()
        .unwrap()
}

#[test]
fn every_fixture_has_a_scenario_and_matches_the_schema() {
    let schema: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(workspace_root().join("docs/trace-format.schema.json")).unwrap(),
    )
    .unwrap();
    let validator = jsonschema::validator_for(&schema).expect("the schema compiles");
    // The schema bites: an env value in a pod record and a CRI call without times fail.
    let leaked: serde_json::Value = serde_json::json!({"type": "pod", "at_ns": 1, "op": "ADD",
        "pod": {"metadata": {"name": "p", "uid": "u"},
                "spec": {"containers": [{"name": "c", "env": [{"name": "TOKEN", "value": "s3cret"}]}]}}});
    assert!(
        !validator.is_valid(&leaked),
        "the schema let an env value through"
    );
    let timeless = serde_json::json!({"type": "cri", "method": "RunPodSandbox", "code": "OK"});
    assert!(!validator.is_valid(&timeless));
    // A wait as the agent writes it validates; one that does not say what it waited for
    // does not.
    let wait = podlapse::trace::TraceRecord::Wait(podlapse::trace::PodWaitRecord {
        start_ns: 1,
        end_ns: 2,
        pod_uid: "u".into(),
        namespace: "default".into(),
        name: "p".into(),
        wait: podlapse::kuberuntime::event::PodWait {
            wait: podlapse::kuberuntime::event::WaitKind::ImagePuller,
            container: Some("c".into()),
            behind: vec!["default/q".into()],
            detail: "serialized image pulls".into(),
        },
    });
    let mut wait = serde_json::to_value(&wait).unwrap();
    assert!(validator.is_valid(&wait), "{wait}");
    wait.as_object_mut().unwrap().remove("wait");
    assert!(!validator.is_valid(&wait), "{wait}");
    // So does a runtime program's exec with its arguments; without them it does not.
    let runtime = podlapse::trace::TraceRecord::Kernel(podlapse::ebpf::KernelEvent::RuntimeExec(
        Box::new(podlapse::ebpf::event::RuntimeExec {
            meta: podlapse::ebpf::event::EventMeta {
                ktime_ns: 5,
                cpu: 0,
                pid: 7,
                tgid: 7,
                comm: podlapse::ebpf::Comm::new("runc"),
                cgroup_id: 1,
            },
            argv: vec!["runc".into(), "start".into(), "0123".into()],
            head_cut: false,
            unreadable: false,
            forked_ns: Some(4),
        }),
    ));
    let mut runtime = serde_json::to_value(&runtime).unwrap();
    assert!(validator.is_valid(&runtime), "{runtime}");
    let mut negative = runtime.clone();
    negative["forked_ns"] = serde_json::json!(-1);
    assert!(!validator.is_valid(&negative), "{negative}");
    runtime.as_object_mut().unwrap().remove("argv");
    assert!(!validator.is_valid(&runtime), "{runtime}");
    for trace in fixtures() {
        let name = trace.file_stem().unwrap().to_string_lossy().to_string();
        let scenario = workspace_root()
            .join("traces/scenarios")
            .join(format!("{name}.yaml"));
        assert!(
            scenario.exists(),
            "{} has no scenario {}",
            trace.display(),
            scenario.display()
        );
        let text = std::fs::read_to_string(&trace).unwrap();
        let mut types = std::collections::BTreeSet::new();
        for (i, line) in text.lines().enumerate() {
            let v: serde_json::Value = serde_json::from_str(line).unwrap();
            if let Some(e) = validator.iter_errors(&v).next() {
                panic!(
                    "{}:{}: {e} at {}",
                    trace.display(),
                    i + 1,
                    e.instance_path()
                );
            }
            types.insert(v["type"].as_str().unwrap().to_string());
        }
        // A real recording: the runtime and the kernel both spoke.
        for t in ["header", "pod", "cri", "event", "footer"] {
            assert!(types.contains(t), "{} has no {t} record", trace.display());
        }
        assert!(
            text.lines()
                .next()
                .unwrap()
                .contains("\"runtime_name\":\"containerd\""),
            "{} was not recorded against containerd",
            trace.display()
        );
    }
}

#[test]
fn every_fixture_replays_without_divergence() {
    for trace in fixtures() {
        let out = replay(&[], &[&trace]);
        assert!(
            out.status.success(),
            "{} diverged:\n{}{}",
            trace.display(),
            stdout(&out),
            stderr(&out)
        );
        assert!(
            stdout(&out).ends_with("result: match\n"),
            "{}",
            stdout(&out)
        );
    }
}

/// The one compatibility with the project's old name: a trace recorded before it was
/// podlapse carries its version as `podtrace_version`. Every fixture, so written, matches
/// the schema and replays to the same bytes as it does today; a header with neither
/// name, or with both, does not match.
#[test]
fn a_trace_recorded_under_the_old_name_reads_and_replays_the_same() {
    let schema: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(workspace_root().join("docs/trace-format.schema.json")).unwrap(),
    )
    .unwrap();
    let validator = jsonschema::validator_for(&schema).expect("the schema compiles");
    let dir = tempfile::tempdir().unwrap();
    for trace in fixtures() {
        let text = std::fs::read_to_string(&trace).unwrap();
        let (header, rest) = text.split_once('\n').unwrap();
        let old = header.replacen("\"podlapse_version\"", "\"podtrace_version\"", 1);
        assert_ne!(old, header, "{} has no podlapse_version", trace.display());
        let old_header: serde_json::Value = serde_json::from_str(&old).unwrap();
        assert!(validator.is_valid(&old_header), "{old}");
        let mut neither = old_header.clone();
        neither.as_object_mut().unwrap().remove("podtrace_version");
        assert!(!validator.is_valid(&neither), "{neither}");
        let mut both = old_header.clone();
        both["podlapse_version"] = old_header["podtrace_version"].clone();
        assert!(!validator.is_valid(&both), "{both}");

        let path = dir.path().join(trace.file_name().unwrap());
        std::fs::write(&path, format!("{old}\n{rest}")).unwrap();
        let today = replay(&["-o", "json"], &[&trace]);
        let then = replay(&["-o", "json"], &[&path]);
        assert!(
            then.status.success(),
            "{}: {}{}",
            path.display(),
            stdout(&then),
            stderr(&then)
        );
        let then_out =
            stdout(&then).replace(&path.display().to_string(), &trace.display().to_string());
        assert_eq!(then_out, stdout(&today), "{}", trace.display());
    }
}

#[test]
fn replaying_twice_gives_identical_bytes() {
    let all = fixtures();
    let refs: Vec<&Path> = all.iter().map(PathBuf::as_path).collect();
    let a = replay(&["-o", "json"], &refs);
    let b = replay(&["-o", "json"], &refs);
    assert!(a.status.success());
    assert_eq!(a.stdout, b.stdout, "two replays of the same traces differ");
}

#[test]
fn a_changed_decision_fails_replay_at_the_right_call() {
    let trace = workspace_root().join("traces/multi-container.jsonl");
    let out = replay(&["--test-flip-pull-policy"], &[&trace]);
    assert_eq!(out.status.code(), Some(1), "{}", stdout(&out));
    let text = stdout(&out);
    // The flipped decision pulls an image the recording found present: the first
    // divergence is a pull the recording never made, where it created the container.
    let at = text
        .find("first divergence in default/")
        .expect("a divergence is shown");
    let block = &text[at..];
    let recorded = block
        .lines()
        .find(|l| l.starts_with("    recorded: "))
        .unwrap();
    let replayed = block
        .lines()
        .find(|l| l.starts_with("    replayed: "))
        .unwrap();
    assert!(recorded.contains("CreateContainer container="), "{block}");
    assert!(
        replayed.contains(
            "PullImage image=127.0.0.1:5000/podlapse/app:1.0 attempt=0 -> NOT IN RECORDING"
        ),
        "{block}"
    );
    assert!(
        block.lines().any(|l| l.starts_with("    both:     ")),
        "no context shown: {block}"
    );
    assert!(
        block.contains("    why:      the recording has no PullImage"),
        "{block}"
    );
    assert!(text.ends_with("result: DIVERGED\n"), "{text}");
}

#[test]
fn what_if_faster_pulls_predicts_an_earlier_start() {
    let trace = workspace_root().join("traces/multi-container.jsonl");
    let out = replay(&["--scale", "PullImage=0.5", "-o", "json"], &[&trace]);
    assert!(out.status.success(), "{}", stderr(&out));
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    for pod in doc[0]["pods"].as_array().unwrap() {
        let pull = pod["stages"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["stage"].as_str().unwrap().starts_with("PullImage"));
        if let Some(p) = pull {
            let (rec, pred) = (
                p["recorded_ns"].as_u64().unwrap(),
                p["replayed_ns"].as_u64().unwrap(),
            );
            // Virtual time advances in whole milliseconds (tokio's timer resolution).
            assert!(
                pred <= rec / 2 + 1_000_000,
                "pull predicted {pred} ns, recorded {rec} ns"
            );
        }
    }
}

fn bad_input(name: &str, text: &str) -> String {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(name);
    std::fs::write(&path, text).unwrap();
    let out = replay(&[], &[&path]);
    assert_eq!(out.status.code(), Some(2), "{name}: {}", stdout(&out));
    stderr(&out)
}

fn fixture_lines() -> Vec<String> {
    std::fs::read_to_string(workspace_root().join("traces/deletion.jsonl"))
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect()
}

#[test]
fn a_corrupt_line_is_named_with_file_and_line() {
    let mut lines = fixture_lines();
    lines[3] = lines[3][..lines[3].len() / 2].to_string();
    let err = bad_input("corrupt.jsonl", &(lines.join("\n") + "\n"));
    assert!(err.contains("corrupt.jsonl:4: corrupt record"), "{err}");
}

/// A trace whose writer was killed: no footer, and a torn last line. Replay says once that
/// it is incomplete and compares each pod up to the cut.
#[test]
fn a_trace_cut_short_replays_up_to_the_cut() {
    let lines = fixture_lines();
    let keep = lines.len() * 3 / 5;
    let torn = &lines[keep][..lines[keep].len() / 2];
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cut.jsonl");
    std::fs::write(&path, lines[..keep].join("\n") + "\n" + torn).unwrap();
    let out = replay(&[], &[&path]);
    let err = stderr(&out);
    assert!(out.status.success(), "{}{err}", stdout(&out));
    let notes: Vec<&str> = err.lines().filter(|l| l.contains("incomplete")).collect();
    assert_eq!(notes.len(), 1, "{err}");
    assert!(
        notes[0].contains(&format!("torn last line {} is left out", keep + 1)),
        "{err}"
    );
    assert!(stdout(&out).contains("trace "), "{}", stdout(&out));
}

#[test]
fn a_newer_schema_names_both_versions() {
    let mut lines = fixture_lines();
    lines[0] = lines[0].replace("\"schema_version\":1", "\"schema_version\":2");
    let err = bad_input("newer.jsonl", &(lines.join("\n") + "\n"));
    assert!(
        err.contains("schema version 2 is newer than this podlapse reads (up to 1)"),
        "{err}"
    );
}

#[test]
fn unknown_fields_and_records_are_skipped() {
    let mut lines = fixture_lines();
    lines[2] = lines[2].replacen('{', "{\"added_in_a_later_release\":true,", 1);
    lines.insert(3, "{\"type\":\"hologram\",\"at_ns\":1}".into());
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("future.jsonl");
    std::fs::write(&path, lines.join("\n") + "\n").unwrap();
    let out = replay(&[], &[&path]);
    assert!(out.status.success(), "{}{}", stdout(&out), stderr(&out));
}
