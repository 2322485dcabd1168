//! gRPC liveness probes on real containerd, as kubelet runs them: a health server in the
//! pod passes its probe while SERVING; switched to NOT_SERVING it fails it and the
//! container is restarted; a probe against a port with nothing listening fails with
//! kubelet's message, and neither disturbs the other pod or the agent.

use std::path::Path;
use std::time::Duration;

use podlapse_tests::agent::{Agent, container, container_pids, phase};
use podlapse_tests::require_lab;

use xtask::lab::IMAGE_APP as APP;
use xtask::lab::REGISTRY_ADDR;
const MINUTE: Duration = Duration::from_secs(60);
const PORT: u16 = 9000;

/// A pod whose container `c` runs `image` with a gRPC liveness probe on `port` for
/// `service`, probed every second and restarted after one failure. With `startup`, a gRPC
/// startup probe on the same service holds the liveness probe back until the server
/// first answers, as a user guards a server that takes time to listen: kubelet probes
/// at once when `initialDelaySeconds` is 0, and a refused first connection waits out
/// grpc-go's one-second reconnect delay, longer than the probe's timeout.
fn probed_pod(name: &str, image: &str, port: u16, service: &str, startup: bool) -> String {
    let probe = |failure_threshold: u32| {
        serde_json::json!({
            "grpc": {"port": port, "service": service},
            "periodSeconds": 1,
            "failureThreshold": failure_threshold,
        })
    };
    let mut container = serde_json::json!({
        "name": "c",
        "image": image,
        "livenessProbe": probe(1),
    });
    if startup {
        container["startupProbe"] = probe(60);
    }
    serde_json::json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {"terminationGracePeriodSeconds": 2, "containers": [container]},
    })
    .to_string()
}

fn event_with(agent: &Agent, pod: &str, reason: &str, message: &str) -> bool {
    agent.events(pod).iter().any(|e| {
        e["reason"] == reason && e["message"].as_str().is_some_and(|m| m.contains(message))
    })
}

#[test]
fn a_grpc_liveness_probe_passes_then_restarts_the_container_when_not_serving() {
    require_lab();
    let agent = Agent::start(
        "grpcprobe",
        &["--backoff-initial", "1s", "--backoff-max", "2s"],
    );
    // The lab's busybox base with this crate's health server in it.
    let image = format!("{REGISTRY_ADDR}/podlapse/grpc-{}:1.0", std::process::id());
    xtask::lab::push_program_image(
        &agent.scratch.path().join("image"),
        &image,
        Path::new(env!("CARGO_BIN_EXE_grpc-health-server")),
        &["grpc-health-server", &PORT.to_string()],
    )
    .expect("building the gRPC health server image");

    agent.write(
        "healthy.yaml",
        &probed_pod("healthy", &image, PORT, "podlapse", true),
    );
    // Nothing listens on this port in the app image.
    agent.write("deaf.yaml", &probed_pod("deaf", APP, PORT, "", false));

    let healthy = agent.wait_pod("healthy", "Running and started", MINUTE, |p| {
        phase(p) == "Running" && container(p, "c")["started"] == true
    });
    let ip = healthy["status"]["podIP"].as_str().unwrap().to_string();
    let deaf = agent.wait_pod("deaf", "restarted by its failing probe", MINUTE, |p| {
        container(p, "c")["restartCount"].as_i64() >= Some(1)
    });
    let deaf_ip = deaf["status"]["podIP"].as_str().unwrap();
    assert!(
        event_with(
            &agent,
            "deaf",
            "Unhealthy",
            &format!(
                "Liveness probe failed: timeout: failed to connect service \"{deaf_ip}:{PORT}\" within 1s: context deadline exceeded"
            )
        ),
        "{:#?}",
        agent.events("deaf")
    );
    // All the while (several probe periods), the serving container passed every probe.
    let healthy = agent.pod("healthy").unwrap();
    let c = container(&healthy, "c");
    assert_eq!(
        (c["restartCount"].as_i64(), c["ready"].as_bool()),
        (Some(0), Some(true))
    );
    assert!(
        !event_with(&agent, "healthy", "Unhealthy", ""),
        "{:#?}",
        agent.events("healthy")
    );

    // The server reports NOT_SERVING: the probe fails and the container is restarted.
    let id = c["containerID"].as_str().unwrap().to_string();
    let pids = container_pids(&id);
    assert!(!pids.is_empty(), "no process of {id}");
    for pid in pids {
        // SAFETY: kill(2) on the health server's process.
        unsafe { libc::kill(pid, libc::SIGUSR1) };
    }
    let restarted = agent.wait_pod("healthy", "restarted when NOT_SERVING", MINUTE, |p| {
        container(p, "c")["restartCount"].as_i64() == Some(1)
    });
    assert!(
        event_with(
            &agent,
            "healthy",
            "Unhealthy",
            "Liveness probe failed: service unhealthy (responded with \"NOT_SERVING\")"
        ),
        "{:#?}",
        agent.events("healthy")
    );
    assert!(
        event_with(
            &agent,
            "healthy",
            "Killing",
            "Container c failed liveness probe, will be restarted"
        ),
        "{:#?}",
        agent.events("healthy")
    );
    // The restarted server serves again and the pod comes back Ready on the same IP.
    let back = agent.wait_pod("healthy", "Ready again", MINUTE, |p| {
        container(p, "c")["ready"] == true && container(p, "c")["restartCount"] == 1
    });
    assert_eq!(back["status"]["podIP"], ip.as_str());
    assert_ne!(container(&restarted, "c")["containerID"], id.as_str());
}
