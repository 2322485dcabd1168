//! The node lab's own contract: `up` twice changes nothing the second time, a busy port
//! is a clear error with nothing half-started, and `down` leaves nothing the lab made:
//! no process, mount, network namespace, veth, bridge, iptables rule or IPAM reservation.
//! These tests start and stop the lab themselves, one at a time.

use std::net::TcpListener;
use std::sync::Mutex;

use podtrace_tests::{Scratch, lab, pod, stderr};
use xtask::lab::{UpOutcome, down, snapshot_residue, status, up};

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
        "apiVersion: v1\nkind: Pod\nmetadata: {name: left-a}\nspec:\n  containers:\n  - {name: c, image: 127.0.0.1:5000/podtrace/app:1.0, command: [sleep, '3600'], ports: [{containerPort: 80, hostPort: 18080}]}\n---\napiVersion: v1\nkind: Pod\nmetadata: {name: left-b}\nspec:\n  containers:\n  - {name: c, image: 127.0.0.1:5000/podtrace/app:1.0, command: [sleep, '3600']}\n",
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
    let holder = TcpListener::bind("127.0.0.1:5000").expect("port 5000 is free before the test");
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
