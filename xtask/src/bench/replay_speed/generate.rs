//! The trace benchmark 5 replays: a busy node's pod churn, written the way `podlapse run
//! --trace` records it. Pods arrive a few hundred milliseconds apart, start (sandbox, pull,
//! create, start), run for a while, are removed and torn down (stop, stop sandbox, remove),
//! with the agent's reads around each sync and its relist every second. Every duration and
//! gap comes from a SplitMix stream with a fixed seed, so every machine generates the same
//! bytes.

use std::fmt::Write as _;
use std::io::{BufWriter, Write};
use std::path::Path;

use anyhow::{Context, bail};
use serde_json::{Value, json};

const NODE: &str = "podlapse-bench";
use crate::lab::IMAGE_APP as IMAGE;
const IMAGE_REF: &str = "sha256:796ed3ee7deb212ebc20b5863c8bcd3b3db0ddf010ff4ab7495113d82695dbaa";
/// The recording's monotonic clock at the header, as a node up for a while would show.
const STARTED_NS: u64 = 5_000_000_000_000;
/// A pod arrives this long after the previous one (ms, uniform): two a second on average,
/// a node kept busy with short jobs.
pub const ARRIVAL_MS: (u64, u64) = (200, 800);
/// How long a pod runs once started before its manifest is removed (ms, uniform).
pub const LIFETIME_MS: (u64, u64) = (5_000, 55_000);
/// kubelet's default max-pods, the header's allocatable: a trace needing more pods at once
/// than a node admits is refused rather than written.
pub const MAX_PODS: usize = 110;
const RELIST_NS: u64 = 1_000_000_000;

/// Deterministic durations, so the same trace is generated on every machine.
struct SplitMix(u64);

impl SplitMix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A duration in `[lo_us, hi_us)` microseconds, in nanoseconds.
    fn between_us(&mut self, lo_us: u64, hi_us: u64) -> u64 {
        lo_us * 1_000 + self.next() % ((hi_us - lo_us) * 1_000)
    }

    /// A duration in `[lo_ms, hi_ms)`, in nanoseconds.
    fn between_ms(&mut self, lo_ms: u64, hi_ms: u64) -> u64 {
        self.between_us(lo_ms * 1_000, hi_ms * 1_000)
    }

    /// How long a read (list or status) takes: 0.8–2.5 ms, as the lab records them.
    fn read(&mut self) -> u64 {
        self.between_us(800, 2_500)
    }
}

fn hex64(seed: u64, salt: u64) -> String {
    let mut r = SplitMix(seed.wrapping_mul(31).wrapping_add(salt));
    (0..4).fold(String::new(), |mut s, _| {
        let _ = write!(s, "{:016x}", r.next());
        s
    })
}

fn pod_uid(i: usize) -> String {
    let h = hex64(i as u64, 7);
    format!(
        "{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

fn pod(i: usize, uid: &str) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": format!("bench-{i:05}"), "namespace": "default", "uid": uid},
        "spec": {
            "containers": [{
                "command": ["sleep", "3600"],
                "image": IMAGE,
                // Always, so every pod has a PullImage of its own to replay.
                "imagePullPolicy": "Always",
                "name": "app",
                "terminationMessagePath": "/dev/termination-log",
                "terminationMessagePolicy": "File"
            }],
            "dnsPolicy": "ClusterFirst",
            "nodeName": NODE,
            "restartPolicy": "Always",
            "schedulerName": "default-scheduler",
            "terminationGracePeriodSeconds": 30
        }
    })
}

/// What a generated trace holds, for the benchmark's method and figures.
pub struct Generated {
    pub span_ns: u64,
    pub records: usize,
    pub cri_calls: usize,
    /// Most pods admitted at once (added and not yet removed).
    pub max_alive: usize,
    /// Pods admitted at once, averaged over time from the first ADD to the last REMOVE.
    pub mean_alive: f64,
}

/// The records of a recording, each with the time a recorder writes it (a call is
/// written when it ends) and a sequence number that keeps ties in the order made.
#[derive(Default)]
struct Records(Vec<(u64, usize, Value)>);

impl Records {
    fn push(&mut self, at: u64, v: Value) {
        let seq = self.0.len();
        self.0.push((at, seq, v));
    }

    /// A successful CRI call starting at `*t` and taking `took`; `*t` moves to just after.
    fn call(&mut self, t: &mut u64, took: u64, mut v: Value) {
        let end = *t + took;
        v["type"] = json!("cri");
        v["attempt"] = json!(0);
        v["start_ns"] = json!(*t);
        v["end_ns"] = json!(end);
        v["code"] = json!("OK");
        self.push(end, v);
        *t = end + 100_000;
    }
}

/// One pod's identities.
struct Ids {
    uid: String,
    sandbox: String,
    container: String,
    ip: String,
}

impl Ids {
    fn of(i: usize) -> Ids {
        Ids {
            uid: pod_uid(i),
            sandbox: hex64(i as u64, 11),
            container: hex64(i as u64, 13),
            ip: format!("10.{}.{}.{}", 128 + (i >> 16), (i >> 8) & 0xff, i & 0xff),
        }
    }

    fn sandbox_call(&self, method: &str) -> Value {
        json!({"method": method, "pod_uid": self.uid, "sandbox_id": self.sandbox})
    }

    fn container_call(&self, method: &str) -> Value {
        json!({"method": method, "pod_uid": self.uid, "container": "app",
               "sandbox_id": self.sandbox, "container_id": self.container})
    }

    fn list(&self, method: &str, count: usize) -> Value {
        json!({"method": method, "pod_uid": self.uid, "response": {"count": count.to_string()}})
    }

    fn sandbox_status(&self) -> Value {
        let mut v = self.sandbox_call("PodSandboxStatus");
        v["response"] = json!({"ip": self.ip, "state": "0"});
        v
    }

    fn container_status(&self) -> Value {
        let mut v = self.container_call("ContainerStatus");
        v["response"] = json!({"exit_code": "0", "state": "1"});
        v
    }

    /// GetPodStatus once the pod has its sandbox and container.
    fn pod_status(&self, out: &mut Records, rng: &mut SplitMix, t: &mut u64) {
        out.call(t, rng.read(), self.list("ListPodSandbox", 1));
        out.call(t, rng.read(), self.sandbox_status());
        out.call(t, rng.read(), self.list("ListContainers", 1));
        out.call(t, rng.read(), self.container_status());
    }
}

/// When a pod's runtime objects exist, for the node-level figures.
struct Life {
    added: u64,
    removed: u64,
    container_created: u64,
    container_removed: u64,
}

/// One pod's life from ADD to its last removal; returns when things happened.
fn pod_life(out: &mut Records, rng: &mut SplitMix, i: usize, seen: u64) -> Life {
    let ids = Ids::of(i);
    out.push(
        seen,
        json!({"type": "pod", "at_ns": seen, "op": "ADD", "pod": pod(i, &ids.uid)}),
    );
    // syncPod: the runtime's view, the network gate, then SyncPod.
    let mut t = seen + rng.between_ms(1, 3);
    out.call(&mut t, rng.read(), ids.list("ListPodSandbox", 0));
    out.call(&mut t, rng.read(), ids.list("ListContainers", 0));
    out.call(
        &mut t,
        rng.read(),
        json!({"method": "Status", "response": {"NetworkReady": "true", "RuntimeReady": "true"}}),
    );
    let took = rng.between_ms(250, 450);
    out.call(&mut t, took, ids.sandbox_call("RunPodSandbox"));
    out.call(&mut t, rng.read(), ids.sandbox_status());
    let took = rng.between_ms(20, 40);
    out.call(
        &mut t,
        took,
        json!({"method": "PullImage", "pod_uid": ids.uid, "image": IMAGE,
               "response": {"auth": "false", "image_ref": IMAGE_REF}}),
    );
    let mut create = ids.container_call("CreateContainer");
    create["image"] = json!(IMAGE);
    let took = rng.between_ms(15, 30);
    out.call(&mut t, took, create);
    let container_created = t;
    let took = rng.between_ms(60, 120);
    out.call(&mut t, took, ids.container_call("StartContainer"));
    let running = t;
    // The PLEG's look for the process to watch, then the status the sync publishes.
    out.call(&mut t, rng.read(), ids.container_status());
    ids.pod_status(out, rng, &mut t);

    let removed = running + rng.between_ms(LIFETIME_MS.0, LIFETIME_MS.1);
    out.push(
        removed,
        json!({"type": "pod", "at_ns": removed, "op": "REMOVE", "pod": pod(i, &ids.uid)}),
    );
    // syncTerminatingPod: the runtime's view, stop, stop the sandbox, remove.
    let mut t = removed + rng.between_ms(1, 3);
    ids.pod_status(out, rng, &mut t);
    let mut stop = ids.container_call("StopContainer");
    stop["response"] = json!({"timeout": "30"});
    let took = rng.between_ms(50, 100);
    out.call(&mut t, took, stop);
    let took = rng.between_ms(120, 200);
    out.call(&mut t, took, ids.sandbox_call("StopPodSandbox"));
    let took = rng.between_ms(3, 6);
    out.call(&mut t, took, ids.container_call("RemoveContainer"));
    let container_removed = t;
    let took = rng.between_ms(15, 30);
    out.call(&mut t, took, ids.sandbox_call("RemovePodSandbox"));
    Life {
        added: seen,
        removed,
        container_created,
        container_removed,
    }
}

/// Each interval's start (+1) and end (-1), in time order; ends before starts at the same
/// instant (a pod removed as another arrives).
fn edges(intervals: &[(u64, u64)]) -> Vec<(u64, i64)> {
    let mut edges: Vec<(u64, i64)> = intervals
        .iter()
        .flat_map(|&(from, to)| [(from, 1), (to, -1)])
        .collect();
    edges.sort_unstable();
    edges
}

/// How many intervals `[from, to)` hold at each of `times` (sorted), by a sweep.
fn counts_at(intervals: &[(u64, u64)], times: &[u64]) -> Vec<usize> {
    let edges = edges(intervals);
    let (mut open, mut next) = (0i64, 0);
    times
        .iter()
        .map(|&at| {
            while next < edges.len() && edges[next].0 <= at {
                open += edges[next].1;
                next += 1;
            }
            open as usize
        })
        .collect()
}

/// The most intervals open at once and the time-weighted mean between the first start
/// and the last end.
fn occupancy(intervals: &[(u64, u64)]) -> (usize, f64) {
    let edges = edges(intervals);
    let (mut open, mut max, mut area) = (0i64, 0i64, 0f64);
    let mut last = edges.first().map_or(0, |e| e.0);
    for &(at, d) in &edges {
        area += open as f64 * (at - last) as f64;
        last = at;
        open += d;
        max = max.max(open);
    }
    let span = edges.last().map_or(0, |e| e.0) - edges.first().map_or(0, |e| e.0);
    (max as usize, area / span.max(1) as f64)
}

/// Writes a trace (format v1) of `pods` pods arriving and leaving as described above.
pub fn generate(path: &Path, pods: usize) -> anyhow::Result<Generated> {
    let mut rng = SplitMix(42);
    let mut out = Records::default();
    let t0 = STARTED_NS + 50_000_000;
    let mut seen = t0;
    let mut lives = Vec::with_capacity(pods);
    for i in 0..pods {
        seen += rng.between_ms(ARRIVAL_MS.0, ARRIVAL_MS.1);
        lives.push(pod_life(&mut out, &mut rng, i, seen));
    }
    let last = out.0.iter().map(|r| r.0).max().unwrap_or(t0);
    // The relist: every container on the node, once a second.
    let relists: Vec<u64> = (t0..last).step_by(RELIST_NS as usize).collect();
    let containers: Vec<(u64, u64)> = lives
        .iter()
        .map(|l| (l.container_created, l.container_removed))
        .collect();
    for (at, count) in relists.iter().zip(counts_at(&containers, &relists)) {
        let mut t = *at;
        out.call(
            &mut t,
            rng.read(),
            json!({"method": "ListContainers", "response": {"count": count.to_string()}}),
        );
    }
    let admitted: Vec<(u64, u64)> = lives.iter().map(|l| (l.added, l.removed)).collect();
    let (max_alive, mean_alive) = occupancy(&admitted);
    if max_alive > MAX_PODS {
        bail!("the generated churn needs {max_alive} pods at once, more than max-pods {MAX_PODS}");
    }
    out.0.sort_by_key(|(at, seq, _)| (*at, *seq));
    let ended_ns = out.0.last().map_or(t0, |r| r.0) + 1_000_000_000;
    let cri_calls = out.0.iter().filter(|r| r.2["type"] == "cri").count();
    let header = json!({
        "type": "header", "schema_version": 1, "podlapse_version": "0.1.0", "node": NODE,
        "kernel": "generated", "runtime_name": "containerd", "runtime_version": "generated",
        "config": {
            "allocatable": {"max_pods": MAX_PODS, "memory_bytes": 1_i64 << 40,
                            "milli_cpu": 1_i64 << 20},
            "backoff_initial_ns": 10_000_000_000_u64, "backoff_max_ns": 300_000_000_000_u64,
            "cgroup_root": "/podlapse", "error_backoff_ns": 10_000_000_000_u64,
            "housekeeping": false,
            // Parallel pulls (kubelet's serializeImagePulls: false): a pod's pull never
            // waits for another pod's.
            "max_parallel_image_pulls": null,
            "relist_period_ns": RELIST_NS, "resync_interval_ns": 60_000_000_000_u64,
            "until_ready": true
        },
        "started_wall_ns": 1_795_336_392_910_148_563_u64, "started_ns": STARTED_NS
    });
    let footer = json!({
        "type": "footer", "ended_ns": ended_ns,
        "counts": {"cri": cri_calls, "pod": pods * 2},
        "lost_events": 0, "lost_by_kind": {}, "ebpf": false
    });
    let file =
        std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))?;
    let mut w = BufWriter::new(file);
    writeln!(w, "{header}")?;
    for (_, _, r) in &out.0 {
        writeln!(w, "{r}")?;
    }
    writeln!(w, "{footer}")?;
    w.flush()?;
    Ok(Generated {
        span_ns: ended_ns - STARTED_NS,
        records: out.0.len() + 2,
        cri_calls,
        max_alive,
        mean_alive,
    })
}

#[cfg(test)]
mod tests {
    use sha2::Digest;

    use super::*;

    #[test]
    fn occupancy_counts_overlaps_and_weights_by_time() {
        // 0..10 and 5..15: two at once for 5 of 15 units.
        let (max, mean) = occupancy(&[(0, 10), (5, 15)]);
        assert_eq!(max, 2);
        assert!((mean - 20.0 / 15.0).abs() < 1e-9, "{mean}");
        assert_eq!(occupancy(&[(0, 5), (5, 10)]).0, 1);
    }

    #[test]
    fn counts_at_sweeps_in_order() {
        assert_eq!(
            counts_at(&[(0, 10), (5, 15)], &[0, 4, 5, 10, 15]),
            vec![1, 1, 2, 1, 0]
        );
    }

    #[test]
    fn the_trace_is_the_same_every_time_and_churns() {
        let dir = std::env::temp_dir();
        let name = |n: &str| {
            dir.join(format!(
                "podlapse-generate-{}-{n}.jsonl",
                std::process::id()
            ))
        };
        let (a, b) = (name("a"), name("b"));
        let ga = generate(&a, 200).unwrap();
        generate(&b, 200).unwrap();
        let (bytes_a, bytes_b) = (std::fs::read(&a).unwrap(), std::fs::read(&b).unwrap());
        let _ = (std::fs::remove_file(&a), std::fs::remove_file(&b));
        assert_eq!(bytes_a, bytes_b);
        // The bytes as generated when this test was written (renamed to podlapse since: the
        // node, cgroup and version names): every machine replays these.
        let digest = sha2::Sha256::digest(&bytes_a);
        let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(
            hex,
            "f1c735e15cd25da759af13bec5fb4f1431cac74d42a567e1a25a151a3a52575d"
        );
        let text = String::from_utf8(bytes_a).unwrap();
        for method in [
            "RunPodSandbox",
            "StartContainer",
            "StopContainer",
            "RemovePodSandbox",
        ] {
            let n = text.matches(&format!("\"method\":\"{method}\"")).count();
            assert_eq!(n, 200, "{method}");
        }
        assert_eq!(text.matches("\"op\":\"REMOVE\"").count(), 200);
        assert!(
            ga.max_alive > 1 && ga.max_alive <= MAX_PODS,
            "{}",
            ga.max_alive
        );
    }

    /// Writes benchmark 5's trace (`super::super::PODS` pods, the same bytes the benchmark
    /// replays) to `$PODLAPSE_BENCH_TRACE`, for checks that want it without running the
    /// benchmark (the agent's golden trace test reads it from `$PODLAPSE_GOLDEN_TRACE`).
    #[test]
    #[ignore = "writes a large file where $PODLAPSE_BENCH_TRACE says"]
    fn writes_the_benchmark_trace() {
        let path = std::env::var_os("PODLAPSE_BENCH_TRACE").expect("PODLAPSE_BENCH_TRACE");
        let g = generate(Path::new(&path), super::super::PODS).unwrap();
        eprintln!(
            "{}: {} records, {} CRI calls",
            Path::new(&path).display(),
            g.records,
            g.cri_calls
        );
    }
}
