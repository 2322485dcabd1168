//! `podtrace observe --metrics-addr`: what the observer sees leaves the node as
//! Prometheus metrics. A CRI client of the suite's own (`cri-pod-client`, not podtrace)
//! creates six pods while the network's range has five addresses: five run, the sixth
//! finds the range full and is retried as a kubelet's pod worker would. The scrape is
//! `promtool check metrics` clean, each stage counts the five pods, and the sixth shows
//! in the live diagnosis's gauge by its cause. A port in use or a host name stops the
//! observer before it starts anything.

use std::time::Duration;

use podtrace_tests::agent::{free_loopback_addr, metric, promtool_check_metrics, scrape};
use podtrace_tests::cni_conf::{ConfSwap, network, pool};
use podtrace_tests::ebpf::{require_probes, serial};
use podtrace_tests::observer::{ClientRun, Observer, cleanup_client_pods};
use podtrace_tests::{Scratch, podtrace_bin, require_lab, stderr};
use xtask::lab::IMAGE_APP;

/// The client's pods, retried until the test kills the client.
const PREFIX: &str = "obs-metrics";
/// As long as a pod's verdict takes to show in the API (the observer's look, the
/// diagnosis's), and more: a bound for a broken observer only.
const SHOWS: Duration = Duration::from_secs(300);

/// The exposition once `done` holds for it, polled every 200 ms (the observer brings its
/// metrics up to date at each scrape), or a failure naming what it waited for.
fn scrape_when(addr: &str, what: &str, done: impl Fn(&str) -> bool) -> String {
    let poll = xtask::poll::Poll::new(what, SHOWS, Duration::from_millis(200));
    let mut text = String::new();
    let held = poll.holds(|| {
        text = scrape(addr);
        done(&text)
    });
    assert!(held, "{what}: not within {SHOWS:?}:\n{text}");
    text
}

#[test]
fn the_observers_metrics_count_every_pods_stages_and_the_pod_without_an_ip_by_cause() {
    let _one = serial();
    require_lab();
    let mut swap = ConfSwap::save();
    let conf = network(&swap, "podtrace-obs-metrics", pool(2, 6));
    swap.use_network(&conf);
    let scratch = Scratch::new();
    let trace = scratch.path().join("observed.jsonl");
    let cri = format!("unix://{}", podtrace_tests::lab().cri_socket().display());
    let addr = free_loopback_addr();
    let observer = Observer::start(&trace, &require_probes(), &cri, &["--metrics-addr", &addr]);
    let client = ClientRun::spawn(
        env!("CARGO_BIN_EXE_cri-pod-client"),
        &cri,
        &[
            "--pods",
            "6",
            "--prefix",
            PREFIX,
            "--image",
            IMAGE_APP,
            "--hold-seconds",
            "900",
            "--retry-sandbox-every",
            "300",
            "--retry-for-seconds",
            "900",
        ],
    );
    let started = client.pods(5);
    assert!(
        started.iter().all(|p| p["ok"] == true),
        "five pods take the five addresses: {started:?}"
    );
    let text = scrape_when(
        &addr,
        "five pods started and the sixth without an IP",
        |t| {
            metric(t, "podtrace_observed_pod_start_duration_seconds_count") == Some(5.0)
                && metric(t, "podtrace_unhealthy_pods{cause=\"ipam_exhausted\"}") == Some(1.0)
                && metric(
                    t,
                    "podtrace_stage_duration_seconds_count{stage=\"app_first_exec\"}",
                ) == Some(5.0)
                // The node's network is looked at once a second, apart from the pods'
                // records: its full range shows at the first look after the fifth pod.
                && metric(t, "podtrace_node_network_findings{cause=\"ipam_exhausted\"}")
                    == Some(1.0)
        },
    );
    client.kill();
    cleanup_client_pods(env!("CARGO_BIN_EXE_cri-pod-client"), &cri, PREFIX);
    promtool_check_metrics(&text);
    // Each stage of the five pods' startups, once per pod, from the kernel and the
    // runtime; the sixth, failed, counts in the stages it reached.
    let stage = |s: &str| {
        metric(
            &text,
            &format!("podtrace_stage_duration_seconds_count{{stage=\"{s}\"}}"),
        )
    };
    for s in [
        "sandbox_ready",
        "container_started",
        "app_first_exec",
        "running",
    ] {
        assert_eq!(stage(s), Some(5.0), "{s}:\n{text}");
    }
    for s in ["pod_seen", "netns_created", "cni_plugin"] {
        assert!(stage(s).is_some_and(|n| n >= 5.0), "{s}:\n{text}");
    }
    // The runs of each plugin of the chain, the failing host-local's by its exit code.
    assert!(
        metric(
            &text,
            "podtrace_cni_plugin_duration_seconds_count{plugin=\"bridge\",exit_code=\"0\"}"
        )
        .is_some_and(|n| n >= 5.0),
        "{text}"
    );
    // The node: its network ready, and its range full (the sixth pod's evidence).
    assert_eq!(
        metric(&text, "podtrace_node_network_ready{reason=\"\"}"),
        Some(1.0),
        "{text}"
    );
    assert_eq!(
        metric(
            &text,
            "podtrace_node_network_findings{cause=\"ipam_exhausted\"}"
        ),
        Some(1.0),
        "{text}"
    );
    // No label names a pod.
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        assert!(!line.contains(PREFIX), "a pod's name in a label: {line}");
    }
    // No family of run's that an observer cannot fill: it made no call of its own.
    assert!(!text.contains("kubelet_runtime_operations"), "{text}");
    // Once the client's pods are removed, the five are not counted as not Running; the
    // sixth, which never had a sandbox the runtime kept, is counted until its client
    // could have tried again (6 minutes: longer than this test waits).
    observer.wait_api(&["pods"], "the client's pods removed", |l| {
        !l["items"].as_array().into_iter().flatten().any(|i| {
            i["metadata"]["name"]
                .as_str()
                .is_some_and(|n| n.starts_with(PREFIX))
        })
    });
    let text = scrape(&addr);
    assert_eq!(
        metric(&text, "podtrace_unhealthy_pods{cause=\"pending\"}").unwrap_or(0.0),
        0.0,
        "{text}"
    );
    assert_eq!(
        metric(&text, "podtrace_unhealthy_pods{cause=\"ipam_exhausted\"}"),
        Some(1.0),
        "{text}"
    );
    assert_eq!(
        metric(&text, "podtrace_observed_pod_start_duration_seconds_count"),
        Some(5.0),
        "{text}"
    );
    let (status, last) = observer.stop();
    assert!(status.success(), "the observer exited {status}: {last:?}");
}

#[test]
fn a_metrics_address_in_use_or_a_host_name_stops_the_observer_before_it_starts() {
    require_lab();
    let cri = format!("unix://{}", podtrace_tests::lab().cri_socket().display());
    let held = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let in_use = held.local_addr().unwrap().to_string();
    for (addr, says) in [
        (in_use.as_str(), format!("metrics address {in_use}: ")),
        (
            "metrics.example:9102",
            "\"metrics.example\" is not an IP address".to_string(),
        ),
    ] {
        let scratch = Scratch::new();
        let trace = scratch.path().join("observed.jsonl");
        let out = std::process::Command::new(podtrace_bin())
            .args(["observe", "--cri", &cri, "--no-api", "--duration", "30"])
            .arg("--trace")
            .arg(&trace)
            .args(["--metrics-addr", addr])
            .output()
            .expect("podtrace observe runs");
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{addr}: {err}");
        assert!(
            err.contains("--metrics-addr") && err.contains(&says),
            "{addr}: {err}"
        );
        assert_eq!(err.lines().count(), 1, "one line: {err}");
        // Nothing started: no trace was begun.
        assert!(!trace.exists(), "{addr}: a trace was started");
    }
}
