//! The node lab's own contract: `up` twice changes nothing the second time, a busy port
//! is a clear error with nothing half-started, and `down` leaves nothing the lab made:
//! no process, mount, network namespace, veth, bridge, iptables rule or IPAM reservation.
//! These tests start and stop the lab themselves, one at a time.

use std::net::TcpListener;
use std::sync::Mutex;

use podlapse_tests::{Scratch, lab, pod, stderr};
use xtask::lab::{
    CONTAINERD_ENV, IMAGE_APP, REGISTRY_ADDR, UpOutcome, down, snapshot_residue, status, up,
};

/// The lab is one per machine (port 5000, one bridge): these tests take turns.
static ONE_LAB: Mutex<()> = Mutex::new(());

fn quiet(_: &str) {}

#[test]
fn down_leaves_nothing_even_with_pods_still_running() {
    let _turn = ONE_LAB.lock().unwrap_or_else(|e| e.into_inner());
    let paths = lab();
    let before = snapshot_residue(&paths);

    match up(&paths, &quiet).expect("lab up") {
        UpOutcome::Started(_) => {}
        UpOutcome::AlreadyUp(_) => panic!("the lab was already up before this test"),
    }
    // A second `up` says so and changes nothing.
    let during = snapshot_residue(&paths);
    assert!(matches!(
        up(&paths, &quiet).expect("second up"),
        UpOutcome::AlreadyUp(_)
    ));
    assert_eq!(
        snapshot_residue(&paths),
        during,
        "a second up changed the node"
    );
    let shown = status(&paths).expect("status").to_string();
    assert!(
        shown.contains("containerd") && shown.contains("registry"),
        "{shown}"
    );

    // Pods left running (no --cleanup): down must remove their sandboxes, netns, veths,
    // iptables rules and IPAM reservations.
    let scratch = Scratch::new();
    let manifest = scratch.manifest(
        "left.yaml",
        &format!("apiVersion: v1\nkind: Pod\nmetadata: {{name: left-a}}\nspec:\n  terminationGracePeriodSeconds: 2\n  containers:\n  - {{name: c, image: {IMAGE_APP}, command: [sleep, '3600'], ports: [{{containerPort: 80, hostPort: 18080}}]}}\n---\napiVersion: v1\nkind: Pod\nmetadata: {{name: left-b}}\nspec:\n  terminationGracePeriodSeconds: 2\n  containers:\n  - {{name: c, image: {IMAGE_APP}, command: [sleep, '3600']}}\n"),
    );
    let (out, doc) = scratch.run(&[&manifest], &[]);
    assert!(out.status.success(), "{doc:#}\n{}", stderr(&out));
    assert_eq!(pod(&doc, "left-a")["phase"], "Running");
    let with_pods = snapshot_residue(&paths);
    assert!(
        !before.diff(&with_pods).is_empty(),
        "the snapshot does not see a running lab"
    );

    down(&paths, &quiet).expect("lab down");
    let after = snapshot_residue(&paths);
    let left = before.diff(&after);
    assert!(left.is_empty(), "down left behind:\n{}", left.join("\n"));
    assert!(!paths.state_file().exists());
    assert!(
        !paths.root.exists(),
        "{} still exists",
        paths.root.display()
    );
    // A second down is harmless.
    down(&paths, &quiet).expect("second down");
}

#[test]
fn busy_registry_port_is_a_clear_error_and_nothing_is_left() {
    let _turn = ONE_LAB.lock().unwrap_or_else(|e| e.into_inner());
    let paths = lab();
    let holder = TcpListener::bind(REGISTRY_ADDR).expect("port 5000 is free before the test");
    let before = snapshot_residue(&paths);
    let err = match up(&paths, &quiet) {
        Ok(_) => panic!("up succeeded with port 5000 taken"),
        Err(e) => e.to_string(),
    };
    assert!(err.contains("5000"), "{err}");
    let left = before.diff(&snapshot_residue(&paths));
    assert!(
        left.is_empty(),
        "a failed up left behind:\n{}",
        left.join("\n")
    );
    assert!(!paths.state_file().exists());
    drop(holder);
}

#[test]
fn a_lab_whose_containerd_was_killed_is_cleaned_up_by_the_next_up() {
    let _turn = ONE_LAB.lock().unwrap_or_else(|e| e.into_inner());
    let paths = lab();
    let before = snapshot_residue(&paths);
    let first = match up(&paths, &quiet).expect("lab up") {
        UpOutcome::Started(s) => s,
        UpOutcome::AlreadyUp(_) => panic!("the lab was already up before this test"),
    };
    let scratch = Scratch::new();
    let manifest = scratch.manifest(
        "stale.yaml",
        &format!("apiVersion: v1\nkind: Pod\nmetadata: {{name: stale}}\nspec:\n  terminationGracePeriodSeconds: 2\n  containers:\n  - {{name: c, image: {IMAGE_APP}, command: [sleep, '3600']}}\n"),
    );
    let (out, doc) = scratch.run(&[&manifest], &[]);
    assert!(out.status.success(), "{doc:#}\n{}", stderr(&out));

    // containerd dies with a pod running: its sandbox, netns and veth are orphaned.
    let pid = first.containerd_pid.to_string();
    assert!(
        std::process::Command::new("kill")
            .args(["-9", &pid])
            .status()
            .unwrap()
            .success()
    );
    let proc_dir = std::path::PathBuf::from(format!("/proc/{pid}"));
    // The kernel finishes the killed process soon; the bound is for one it never does.
    podlapse_tests::eventually(
        "the kernel to finish the killed containerd",
        std::time::Duration::from_secs(60),
        std::time::Duration::from_millis(50),
        || {
            let gone = !proc_dir.exists()
                || std::fs::read_to_string(proc_dir.join("stat")).is_ok_and(|s| s.contains(") Z "));
            if gone { Ok(()) } else { Err("still running") }
        },
    );
    assert!(
        !status(&paths).expect("status").is_up(),
        "status still says up"
    );

    // The next `up` notices, cleans up without containerd's help, and starts afresh.
    let second = match up(&paths, &quiet).expect("up over a stale lab") {
        UpOutcome::Started(s) => s,
        UpOutcome::AlreadyUp(_) => panic!("a lab with a dead containerd was taken as up"),
    };
    assert_ne!(second.containerd_pid, first.containerd_pid);
    down(&paths, &quiet).expect("lab down");
    let left = before.diff(&snapshot_residue(&paths));
    assert!(left.is_empty(), "left behind:\n{}", left.join("\n"));
}

#[test]
fn a_half_up_lab_names_the_failed_part_and_tears_down_what_started() {
    let _turn = ONE_LAB.lock().unwrap_or_else(|e| e.into_inner());
    let paths = lab();
    // A "containerd" that dies at once, after the registry is already running.
    let dir = tempfile::tempdir().unwrap();
    let fake = dir.path().join("containerd-that-fails");
    std::fs::write(
        &fake,
        "#!/bin/sh\necho 'simulated start-up failure' >&2\nexit 1\n",
    )
    .unwrap();
    std::fs::set_permissions(&fake, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let before = snapshot_residue(&paths);
    // SAFETY: the ONE_LAB lock serialises every test in this binary that reads the
    // environment, and the variable is removed before the lock is released.
    unsafe { std::env::set_var(CONTAINERD_ENV, &fake) };
    let result = up(&paths, &quiet);
    unsafe { std::env::remove_var(CONTAINERD_ENV) };
    let err = match result {
        Ok(_) => panic!("up succeeded with a containerd that exits"),
        Err(e) => e.to_string(),
    };
    assert!(err.contains("containerd"), "{err}");
    assert!(
        err.contains("simulated start-up failure"),
        "the log tail is missing: {err}"
    );
    let left = before.diff(&snapshot_residue(&paths));
    assert!(
        left.is_empty(),
        "a half-up lab left behind:\n{}",
        left.join("\n")
    );
    assert!(!paths.state_file().exists());
}
