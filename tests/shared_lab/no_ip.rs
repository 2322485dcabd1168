//! "Why has this pod no IP?" for the causes real nodes have, made for real on the node's
//! own runtime (the host lab, and the modern node's containerd 2.x in its guest): a CRI
//! client of the suite's own (`cri-pod-client`, not podlapse) creates pods beside
//! `podlapse observe` while the node's CNI configuration is broken one way at a time,
//! and the verdict is read from `diagnose --live` while the pod fails, then from
//! `diagnose` on the observed trace afterwards, each with its evidence:
//!
//! - the network names a plugin that is not installed;
//! - the IPAM range has no free address, and a range full of reservations of sandboxes
//!   that no longer exist (leaked);
//! - every plugin succeeds but the result has no address;
//! - no network configuration at all, or a file that does not parse (the node's
//!   finding).
//!
//! `podlapse run`'s own pods get the same verdicts from the runtime's words (a plugin
//! that is not installed, a used-up range). Each test changes the network every pod on
//! the runtime uses and puts it back (`ConfSwap`); the module's tests run one at a time.

use std::time::{Duration, SystemTime};

use podlapse_tests::cni_conf::{ConfSwap, network, pool, runtime_network};
use podlapse_tests::ebpf::{require_probes, serial};
use podlapse_tests::observer::{ClientRun, Observer, cleanup_client_pods};
use podlapse_tests::{Scratch, podlapse_bin, require_lab, stderr};
use serde_json::Value;
use xtask::lab::IMAGE_APP;

/// The client's pods under `prefix`, observed while the network is broken.
struct Broken {
    /// Holds the trace and the API socket.
    _scratch: Scratch,
    trace: std::path::PathBuf,
    observer: Option<Observer>,
    client: Option<ClientRun>,
    prefix: &'static str,
    cri: String,
}

impl Broken {
    /// The observer, then `pods` pods of the client that retry their sandbox (as a
    /// kubelet's pod worker does) until the test is done with them.
    fn start(prefix: &'static str, pods: usize) -> Broken {
        let scratch = Scratch::new();
        let trace = scratch.path().join("observed.jsonl");
        let cri = format!("unix://{}", podlapse_tests::lab().cri_socket().display());
        let observer = Observer::start(&trace, &require_probes(), &cri, &[]);
        let n = pods.to_string();
        let client = ClientRun::spawn(
            env!("CARGO_BIN_EXE_cri-pod-client"),
            &cri,
            &[
                "--pods",
                &n,
                "--prefix",
                prefix,
                "--image",
                IMAGE_APP,
                "--hold-seconds",
                "900",
                "--retry-sandbox-every",
                "300",
                // Longer than the test waits: it is killed once the verdicts are in.
                "--retry-for-seconds",
                "900",
            ],
        );
        Broken {
            _scratch: scratch,
            trace,
            observer: Some(observer),
            client: Some(client),
            prefix,
            cri,
        }
    }

    fn observer(&self) -> &Observer {
        self.observer.as_ref().unwrap()
    }

    /// The live diagnosis once pod `name` has `cause`.
    fn live(&self, name: &str, cause: &str) -> Value {
        self.live_with(name, cause, "")
    }

    /// The live diagnosis once pod `name` has `cause` with evidence saying `text` (the
    /// observer looks at the node's network once a second: its evidence can come a look
    /// after the verdict).
    fn live_with(&self, name: &str, cause: &str, text: &str) -> Value {
        self.observer().wait_api(
            &["diagnose", "--live"],
            &format!("{name}: {cause} ({text})"),
            |d| verdict(d, name).is_some_and(|v| v["cause"] == cause && has(v, text)),
        )
    }

    /// Stops the client (its pods removed) and the observer; the diagnosis of the trace.
    fn finish(mut self) -> Value {
        if let Some(c) = self.client.take() {
            c.kill();
        }
        cleanup(&self.cri, self.prefix);
        let (status, last) = self.observer.take().unwrap().stop();
        assert!(status.success(), "the observer exited {status}: {last:?}");
        let out = std::process::Command::new(podlapse_bin())
            .args(["diagnose", "-o", "json"])
            .arg(&self.trace)
            .output()
            .expect("podlapse diagnose");
        serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("diagnose printed no JSON ({e}): {}", stderr(&out)))
    }
}

impl Drop for Broken {
    fn drop(&mut self) {
        if let Some(c) = self.client.take() {
            c.kill();
            cleanup(&self.cri, self.prefix);
        }
    }
}

fn cleanup(cri: &str, prefix: &str) {
    cleanup_client_pods(env!("CARGO_BIN_EXE_cri-pod-client"), cri, prefix);
}

/// Pod `name`'s verdict in a diagnosis.
fn verdict<'a>(d: &'a Value, name: &str) -> Option<&'a Value> {
    d["pods"]
        .as_array()?
        .iter()
        .find(|p| p["name"] == name)
        .map(|p| &p["verdict"])
}

fn evidence(f: &Value) -> Vec<String> {
    f["evidence"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|e| e.as_str().map(str::to_string))
        .collect()
}

fn has(f: &Value, text: &str) -> bool {
    evidence(f).iter().any(|e| e.contains(text))
}

/// The node's finding of `cause` in a diagnosis.
fn node<'a>(d: &'a Value, cause: &str) -> Option<&'a Value> {
    d["node"].as_array()?.iter().find(|f| f["cause"] == cause)
}

fn short(id: &str) -> &str {
    &id[..12]
}

#[test]
fn a_network_naming_a_plugin_that_is_not_installed_is_cni_plugin_missing() {
    let _one = serial();
    require_lab();
    let mut swap = ConfSwap::save();
    let conf = network(&swap, "podlapse-noip-missing", |p| {
        p["type"] = "podlapse-absent-plugin".into()
    });
    swap.use_network(&conf);
    let bin_dirs = runtime_network().bin_dirs.join(" ");
    let run = Broken::start("noip-missing", 1);
    let live = run.live_with("noip-missing-0", "cni_plugin_missing", "never exec'd");
    let trace = run.finish();
    for d in [&live, &trace] {
        let v = verdict(d, "noip-missing-0").unwrap();
        assert_eq!(v["cause"], "cni_plugin_missing", "{d:#}");
        assert_eq!(v["stage"], "cni_plugin:podlapse-absent-plugin", "{d:#}");
        assert!(
            v["summary"]
                .as_str()
                .unwrap()
                .contains(&format!("[{bin_dirs}]")),
            "{d:#}"
        );
        // The kernel agrees: the chain stopped before the plugin's exec.
        assert!(has(v, "podlapse-absent-plugin never exec'd"), "{d:#}");
        let n = node(d, "cni_plugin_missing").unwrap_or_else(|| panic!("no node finding: {d:#}"));
        assert!(
            has(
                n,
                &format!(
                    "no executable for plugin podlapse-absent-plugin in the runtime's plugin directories [{bin_dirs}]"
                )
            ),
            "{d:#}"
        );
    }
}

#[test]
fn a_used_up_range_names_the_range_and_who_holds_it_and_a_running_pod_stays_healthy() {
    let _one = serial();
    require_lab();
    let mut swap = ConfSwap::save();
    // One address: the first pod gets it, the second finds none.
    let conf = network(&swap, "podlapse-noip-full", pool(2, 2));
    swap.use_network(&conf);
    let run = Broken::start("noip-full", 2);
    let first = run.client.as_ref().unwrap().pods(1).remove(0);
    assert_eq!(
        first["ok"], true,
        "the first pod takes the one address: {first}"
    );
    let holder = first["sandbox_id"].as_str().unwrap().to_string();
    let (running, failing) = if first["name"] == "noip-full-0" {
        ("noip-full-0", "noip-full-1")
    } else {
        ("noip-full-1", "noip-full-0")
    };
    let live = run.live_with(failing, "ipam_exhausted", "none free");
    let trace = run.finish();
    for d in [&live, &trace] {
        let v = verdict(d, failing).unwrap();
        assert_eq!(v["stage"], "cni_plugin:host-local", "{d:#}");
        assert!(has(v, "has 1 of 1 addresses held: none free"), "{d:#}");
        assert!(has(v, &format!("by sandbox {}", short(&holder))), "{d:#}");
        assert!(!has(v, "leaked"), "no reservation is leaked: {d:#}");
        assert!(
            has(
                v,
                &format!("by sandbox {} (pod default/{running})", short(&holder))
            ),
            "{d:#}"
        );
    }
    // While it is full, the node says so; once the client's pods are gone (the trace's
    // last look), the address is free again and the node has no finding.
    assert!(node(&live, "ipam_exhausted").is_some(), "{live:#}");
    assert!(node(&trace, "ipam_exhausted").is_none(), "{trace:#}");
    // Consistent with the runtime: the pod that runs is healthy.
    let v = verdict(&live, running).unwrap();
    assert_eq!(v["cause"], "healthy", "{live:#}");
}

#[test]
fn a_range_full_of_leaked_reservations_names_the_leaked_ids_as_the_reason() {
    let _one = serial();
    require_lab();
    let mut swap = ConfSwap::save();
    let name = "podlapse-noip-leak";
    let conf = network(&swap, name, pool(2, 3));
    // host-local's store as a node left it after sandboxes went away without a CNI DEL
    // (a runtime killed mid-ADD, a node that lost its runtime's state): every address
    // held by an ID no sandbox has, written long before.
    let store = swap.store_of(name);
    std::fs::create_dir_all(&store).unwrap();
    let subnet = conf["plugins"][0]["ipam"]["ranges"][0][0]["subnet"]
        .as_str()
        .unwrap()
        .to_string();
    let base = subnet.rsplit_once('.').unwrap().0.to_string();
    let leaked: Vec<(String, String)> = [("2", "1e"), ("3", "2e")]
        .iter()
        .map(|(host, id)| (format!("{base}.{host}"), id.repeat(32)))
        .collect();
    for (ip, id) in &leaked {
        let path = store.join(ip);
        std::fs::write(&path, format!("{id}\r\neth0")).unwrap();
        let old = SystemTime::now() - Duration::from_secs(3600);
        std::fs::File::options()
            .write(true)
            .open(&path)
            .unwrap()
            .set_modified(old)
            .unwrap();
    }
    swap.use_network(&conf);
    let run = Broken::start("noip-leak", 1);
    let live = run.live_with("noip-leak-0", "ipam_exhausted", "the leaks are why");
    let trace = run.finish();
    for d in [&live, &trace] {
        let v = verdict(d, "noip-leak-0").unwrap();
        assert!(
            v["summary"]
                .as_str()
                .unwrap()
                .contains("(2 held by sandboxes that no longer exist)"),
            "{d:#}"
        );
        for (ip, id) in &leaked {
            assert!(has(v, &format!("{ip} ({id})")), "{d:#}");
        }
        assert!(has(v, "the leaks are why the range is full"), "{d:#}");
        let n = node(d, "ipam_exhausted").unwrap_or_else(|| panic!("no node finding: {d:#}"));
        assert!(
            n["summary"]
                .as_str()
                .unwrap()
                .contains("2 by sandboxes the runtime does not know (leaked)"),
            "{d:#}"
        );
    }
}

#[test]
fn a_chain_that_succeeds_without_an_address_is_cni_no_address() {
    let _one = serial();
    require_lab();
    let mut swap = ConfSwap::save();
    // bridge without IPAM: a layer-2 network; every plugin exits 0, no address comes.
    let conf = network(&swap, "podlapse-noip-noaddr", |p| {
        p.as_object_mut().unwrap().remove("ipam");
        p["isGateway"] = false.into();
        p["ipMasq"] = false.into();
    });
    swap.use_network(&conf);
    let run = Broken::start("noip-noaddr", 1);
    let live = run.live("noip-noaddr-0", "cni_no_address");
    let trace = run.finish();
    for d in [&live, &trace] {
        let v = verdict(d, "noip-noaddr-0").unwrap();
        assert_eq!(v["stage"], "cni_add", "{d:#}");
        assert!(has(v, "bridge (exit 0)"), "{d:#}");
        assert!(
            has(v, "the runtime uses network podlapse-noip-noaddr"),
            "{d:#}"
        );
    }
}

#[test]
fn no_configuration_or_a_file_that_does_not_parse_is_the_nodes_finding() {
    let _one = serial();
    require_lab();
    // None at all.
    let mut swap = ConfSwap::save();
    let dir = swap.dir().display().to_string();
    swap.remove_all();
    let run = Broken::start("noip-noconf", 1);
    let live = run.observer().wait_api(
        &["diagnose", "--live"],
        "the node's network not ready",
        |d| node(d, "network_not_ready").is_some(),
    );
    let pods = std::process::Command::new(podlapse_bin())
        .args(["pods", "--api-socket"])
        .arg(run.trace.with_extension("sock"))
        .output()
        .expect("podlapse pods");
    let table = String::from_utf8_lossy(&pods.stdout).into_owned();
    assert!(table.starts_with("node: network_not_ready: "), "{table}");
    let trace = run.finish();
    for d in [&live, &trace] {
        let n = node(d, "network_not_ready").unwrap_or_else(|| panic!("{d:#}"));
        assert!(
            n["summary"]
                .as_str()
                .unwrap()
                .contains(&format!("no network configuration in {dir}")),
            "{d:#}"
        );
        assert!(has(n, "CRI Status: NetworkReady=false"), "{d:#}");
        assert!(
            has(n, "cni plugin not initialized"),
            "the runtime's own words: {d:#}"
        );
    }
    drop(swap);

    // A file that does not parse, first in libcni's order: the runtime loads nothing.
    let mut swap = ConfSwap::save();
    swap.add_broken(
        "00-podlapse-broken.conflist",
        "{\"name\": \"x\", \"plugins\": [ {\"type\": \"bridge\"} ",
    );
    let run = Broken::start("noip-broken", 1);
    let live = run.observer().wait_api(
        &["diagnose", "--live"],
        "the node's network not ready",
        |d| node(d, "network_not_ready").is_some(),
    );
    let trace = run.finish();
    for d in [&live, &trace] {
        let n = node(d, "network_not_ready").unwrap();
        assert!(
            has(n, "1. 00-podlapse-broken.conflist: is not valid JSON")
                && has(n, "the runtime's load stops here"),
            "{d:#}"
        );
        assert!(has(n, "not loaded: an earlier file fails"), "{d:#}");
        assert!(has(n, "00-podlapse-broken.conflist"), "{d:#}");
    }
}

/// `podlapse run --until-ready` of one pod; the diagnosis of its trace.
fn run_diagnosis(scratch: &Scratch, name: &str) -> Value {
    let manifest = scratch.manifest(
        "pod.yaml",
        &format!("apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}}}\nspec:\n  terminationGracePeriodSeconds: 1\n  containers:\n  - {{name: app, image: {IMAGE_APP}, command: [sleep, '3600']}}\n"),
    );
    let trace = scratch.path().join("run.jsonl");
    let probes = require_probes();
    let (out, _) = scratch.run(
        &[&manifest],
        &[
            "--ready-timeout",
            "8",
            "--cleanup",
            "--trace",
            trace.to_str().unwrap(),
            "--probes",
            probes.to_str().unwrap(),
        ],
    );
    assert!(!out.status.success(), "the pod ran on a broken network");
    let d = std::process::Command::new(podlapse_bin())
        .args(["diagnose", "-o", "json"])
        .arg(&trace)
        .output()
        .expect("podlapse diagnose");
    serde_json::from_slice(&d.stdout).unwrap_or_else(|e| panic!("no JSON ({e}): {}", stderr(&d)))
}

#[test]
fn podlapses_own_pods_get_the_same_verdicts_from_the_runtimes_words() {
    let _one = serial();
    require_lab();
    let scratch = Scratch::new();
    let mut swap = ConfSwap::save();
    let conf = network(&swap, "podlapse-noip-run-missing", |p| {
        p["type"] = "podlapse-absent-plugin".into()
    });
    swap.use_network(&conf);
    let d = run_diagnosis(&scratch, "run-missing");
    let v = &d["pods"][0]["verdict"];
    assert_eq!(v["cause"], "cni_plugin_missing", "{d:#}");
    assert_eq!(v["stage"], "cni_plugin:podlapse-absent-plugin", "{d:#}");
    drop(swap);

    let scratch = Scratch::new();
    let mut swap = ConfSwap::save();
    let name = "podlapse-noip-run-full";
    let conf = network(&swap, name, pool(2, 2));
    let store = swap.store_of(name);
    std::fs::create_dir_all(&store).unwrap();
    let base = conf["plugins"][0]["ipam"]["ranges"][0][0]["subnet"]
        .as_str()
        .unwrap()
        .rsplit_once('.')
        .unwrap()
        .0
        .to_string();
    std::fs::write(
        store.join(format!("{base}.2")),
        format!("{}\r\neth0", "3e".repeat(32)),
    )
    .unwrap();
    swap.use_network(&conf);
    let d = run_diagnosis(&scratch, "run-full");
    let v = &d["pods"][0]["verdict"];
    assert_eq!(v["cause"], "ipam_exhausted", "{d:#}");
    assert!(
        has(
            v,
            &format!("no IP addresses available in range set: {base}.2-{base}.2")
        ),
        "the runtime's words: {d:#}"
    );
}
