//! A trace is most needed right after something went wrong: an agent SIGKILLed while it
//! records keeps what it recorded, the file is private, and every reader works on it.

use std::os::unix::fs::PermissionsExt;
use std::process::Command;
use std::time::Duration;

use podlapse_tests::agent::{Agent, phase};
use podlapse_tests::{podlapse_bin, require_lab, runtime_objects, stderr, stdout};
use serde_json::Value;

use xtask::lab::IMAGE_APP as APP;
const PODS: [&str; 4] = ["kept-a", "kept-b", "kept-c", "kept-d"];

fn read(args: &[&str]) -> (Value, String) {
    let out = Command::new(podlapse_bin()).args(args).output().unwrap();
    assert!(
        out.status.success(),
        "podlapse {args:?}: {}{}",
        stdout(&out),
        stderr(&out)
    );
    let doc = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("podlapse {args:?} printed no JSON ({e}): {}", stdout(&out)));
    (doc, stderr(&out))
}

/// Says once that the file is incomplete, naming it.
fn says_incomplete_once(err: &str, file: &str) {
    let notes: Vec<&str> = err.lines().filter(|l| l.contains("incomplete")).collect();
    assert_eq!(notes.len(), 1, "{err}");
    assert!(
        notes[0].contains(file) && notes[0].contains("ends without its footer"),
        "{err}"
    );
}

#[test]
fn an_agent_killed_while_recording_keeps_its_trace_and_adopts_its_pods() {
    require_lab();
    let dir = tempfile::tempdir().unwrap();
    let first = dir.path().join("first.jsonl");
    let second = dir.path().join("second.jsonl");
    let mut agent = Agent::start("crashsafe", &["--trace", first.to_str().unwrap()]);
    for name in PODS {
        agent.write(
            &format!("{name}.yaml"),
            &format!(
                "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}, namespace: default}}\nspec:\n  terminationGracePeriodSeconds: 2\n  containers:\n  - {{name: app, image: {APP}, command: [sleep, '3600']}}\n"
            ),
        );
    }
    agent.wait_for("four pods Running", Duration::from_secs(120), |pods| {
        PODS.iter().all(|n| {
            pods.iter()
                .any(|p| p["name"] == agent.name(n).as_str() && phase(p) == "Running")
        })
    });
    let uids: Vec<String> = agent
        .pods()
        .iter()
        .map(|p| p["uid"].as_str().unwrap().to_string())
        .collect();
    agent.kill9();

    // What it had recorded is there, private, and without a footer.
    let mode = std::fs::metadata(&first).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "the trace holds pod specs: {mode:o}");
    let text = std::fs::read_to_string(&first).unwrap();
    assert!(!text.contains("\"type\":\"footer\""));
    let path = first.to_str().unwrap();

    let (timeline, err) = read(&["timeline", path, "-o", "json"]);
    says_incomplete_once(&err, path);
    for name in PODS {
        let p = timeline["pods"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["name"] == agent.name(name).as_str())
            .unwrap_or_else(|| panic!("no timeline for {name}: {timeline:#}"));
        let stages: Vec<&str> = p["stages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["stage"].as_str().unwrap())
            .collect();
        for want in ["sandbox_ready", "container_start:app", "running"] {
            assert!(stages.contains(&want), "{name}: no {want} in {stages:?}");
        }
    }
    let (report, err) = read(&["report", path, "-o", "json"]);
    says_incomplete_once(&err, path);
    let text = report.to_string();
    for name in PODS {
        assert!(text.contains(name), "report without {name}: {report:#}");
    }
    let out = Command::new(podlapse_bin())
        .args(["diagnose", path, "-o", "json"])
        .output()
        .unwrap();
    says_incomplete_once(&stderr(&out), path);
    let diagnosis: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "diagnose printed no JSON ({e}): {}{}",
            stdout(&out),
            stderr(&out)
        )
    });
    let verdicts = diagnosis.to_string();
    for name in PODS {
        assert!(
            verdicts.contains(name),
            "no verdict for {name}: {diagnosis:#}"
        );
    }

    // Restarted with a new trace: the pods are adopted, not made again.
    agent.set_extra(&["--trace", second.to_str().unwrap()]);
    agent.spawn();
    agent.wait_for("the pods adopted", Duration::from_secs(60), |pods| {
        PODS.iter().all(|n| {
            pods.iter()
                .any(|p| p["name"] == agent.name(n).as_str() && phase(p) == "Running")
        })
    });
    for uid in &uids {
        let (sandboxes, _) = runtime_objects(uid);
        assert_eq!(sandboxes.len(), 1, "{uid}: {sandboxes:?}");
    }
    // Both traces read (the second is still being written: it too reads as incomplete).
    let (again, err) = read(&["timeline", second.to_str().unwrap(), "-o", "json"]);
    says_incomplete_once(&err, second.to_str().unwrap());
    assert!(again["pods"].is_array(), "{again:#}");
    let (_, _) = read(&["timeline", path, "-o", "json"]);
}

/// Unmounts a test's small file system.
struct Mounted(std::path::PathBuf);

impl Drop for Mounted {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

#[test]
fn a_full_disk_stops_the_trace_not_the_pods() {
    require_lab();
    let scratch = podlapse_tests::Scratch::new();
    let small = scratch.path().join("small");
    std::fs::create_dir_all(&small).unwrap();
    let mounted = Command::new("mount")
        .args([
            "-t",
            "tmpfs",
            "-o",
            "size=16k",
            "podlapse-test",
            small.to_str().unwrap(),
        ])
        .status()
        .unwrap();
    assert!(mounted.success(), "mount a 16 KiB tmpfs");
    let _unmount = Mounted(small.clone());
    let trace = small.join("trace.jsonl");
    let manifest = scratch.manifest(
        "pod.yaml",
        &format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: disk-full}}\nspec:\n  terminationGracePeriodSeconds: 2\n  containers:\n  - {{name: app, image: {APP}, command: [sleep, '3600']}}\n"
        ),
    );
    let (out, doc) = scratch.run(
        &[&manifest],
        &["--cleanup", "--trace", trace.to_str().unwrap()],
    );
    let err = stderr(&out);
    // The pod ran and was cleaned up as usual.
    let p = podlapse_tests::pod(&doc, "disk-full");
    assert_eq!(p["phase"], "Running", "{doc:#}\n{err}");
    assert_eq!(doc["cleaned_up"], true, "{doc:#}");
    // The trace stopped, said once and why, and what it could not write is counted.
    let said: Vec<&str> = err
        .lines()
        .filter(|l| l.contains("stopped writing"))
        .collect();
    assert_eq!(said.len(), 1, "{err}");
    assert!(
        said[0].contains(trace.to_str().unwrap()) && said[0].contains("No space left"),
        "{err}"
    );
    let lost: u64 = err
        .lines()
        .find_map(|l| {
            let (before, _) = l.split_once(" records could not be written")?;
            before.rsplit(' ').next()?.parse().ok()
        })
        .unwrap_or_else(|| panic!("no count of unwritten records: {err}"));
    assert!(lost > 0, "{err}");
    assert_eq!(
        out.status.code(),
        Some(1),
        "a trace with holes fails the run: {err}"
    );
    // What reached the disk reads, as an incomplete trace.
    let (timeline, note) = read(&["timeline", trace.to_str().unwrap(), "-o", "json"]);
    says_incomplete_once(&note, trace.to_str().unwrap());
    assert!(timeline["pods"].is_array(), "{timeline:#}");
}
