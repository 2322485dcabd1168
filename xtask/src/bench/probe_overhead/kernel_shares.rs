//! Benchmark 13: the probes' shares on each other kernel of the matrix (5.10, 6.1, 7.2;
//! the host's and 6.12's are benchmark 4's). Each kernel boots the modern node's userland
//! in its QEMU guest and measures what the kernel accounts, and only that: the probes'
//! loss and run time per hit at full speed (the kernel's BPF statistics), and the lines on
//! pods, the programs' run time per pod created as a share of the node's CPU per pod.
//! Benchmark 4's wall-clock series, context only, are not run again here.

use std::path::Path;

use anyhow::Context;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use xtask::text::list;

use super::super::agent_cost::Node;
use super::super::sequential::Verdict;
use super::super::{Figure, Outcome};
use super::pod_share::{self, PodShares};
use super::{
    BpfStats, Counted, GOAL_LOST, LOSS_RUN, counted_runs, exec_target, in_node, kernel_release,
    rate, stats_sysctl, worst_per_hit,
};
use crate::node_vm::kernels::{self, GuestKernel};

pub const NUMBER: u8 = 13;
pub const TITLE: &str = "Probes across kernels";

/// What one kernel's run measured, sent back from the guest as JSON.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct KernelShares {
    /// `uname -r` in the guest.
    kernel: String,
    workers: usize,
    /// The exec workload's command, as shown.
    target: String,
    /// kernel.bpf_stats_enabled before the counted runs.
    stats_before: String,
    counted: Counted,
    pods: PodShares,
}

/// In the guest (`xtask bench-probe-overhead --shares-only`): the counted runs with the
/// kernel's statistics on, then the lines on pods on the node's containerd.
pub fn measure(
    bin: &Path,
    dir: &Path,
    exec: Option<&Path>,
    pods_on: &Node,
) -> anyhow::Result<KernelShares> {
    let work = dir.join("probe-shares");
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(&work).with_context(|| format!("creating {}", work.display()))?;
    let target = exec_target(exec)?;
    let workers = std::thread::available_parallelism().map_or(1, |n| n.get());
    let stats_before = stats_sysctl()?;
    let stats = BpfStats::enable()?;
    let counted = counted_runs(bin, &work, &target, workers);
    drop(stats);
    let counted = counted?;
    eprintln!(
        "bench: {NUMBER}. kernel {}: {} s at full speed: {:.0} execs/s, {} events, {} lost",
        kernel_release(),
        LOSS_RUN.as_secs(),
        rate(&[counted.run]),
        counted.summary.events,
        counted.summary.lost
    );
    let pods = pod_share::measure(bin, dir, pods_on, pod_share::Scale::EMULATED)
        .unwrap_or_else(|e| PodShares::NotMeasured(format!("{e:#}")));
    Ok(KernelShares {
        kernel: kernel_release(),
        workers,
        target: target.shown,
        stats_before,
        counted,
        pods,
    })
}

/// The kernels this benchmark boots: every one of the matrix but the modern node's own.
pub fn kernels() -> impl Iterator<Item = &'static GuestKernel> {
    kernels::KERNELS.iter().filter(|k| !k.is_reference())
}

/// On the host: each kernel in turn, the lab up for its registry. A kernel whose run fails
/// is said in the verdict; the others' figures stay.
pub fn run(bin: &Path, dir: &Path) -> anyhow::Result<Outcome> {
    let runs: Vec<(&GuestKernel, Result<KernelShares, String>)> = super::super::with_lab(|| {
        Ok(kernels()
            .map(|k| {
                eprintln!("bench: {NUMBER}. kernel {k}");
                let measured =
                    in_node::run_in_guest::<KernelShares>(bin, dir, k, &["--shares-only".into()])
                        .map_err(|e| format!("{e:#}"));
                if let Err(e) = &measured {
                    eprintln!("bench: {NUMBER}. kernel {k} failed: {e}");
                }
                (k, measured)
            })
            .collect())
    })?;
    if runs.iter().all(|(_, m)| m.is_err()) {
        anyhow::bail!(
            "{}",
            list(&runs, "; ", |(k, m)| format!(
                "kernel {}: {}",
                k.name,
                m.as_ref().err().map_or("", |e| e)
            ))
        );
    }
    Ok(render(&runs))
}

/// The figures and verdict of every kernel's run.
fn render(runs: &[(&GuestKernel, Result<KernelShares, String>)]) -> Outcome {
    let mut figures = Vec::new();
    let mut verdicts = Vec::new();
    let mut texts = Vec::new();
    for (k, measured) in runs {
        let label = format!("kernel {}", k.name);
        match measured {
            Ok(m) => {
                let (v, text) = judged(m);
                verdicts.push(v);
                texts.push(format!("{label} ({}): {text}", m.kernel));
                figures.extend(
                    kernel_figures(m)
                        .into_iter()
                        .chain(m.pods.figures())
                        .map(|f| Figure::new(&format!("{label}: {}", f.name), f.value)),
                );
            }
            Err(e) => {
                verdicts.push(Verdict::Undecided);
                texts.push(format!("{label}: not measured: {e}"));
                figures.push(Figure::new(
                    &format!("{label}: the run"),
                    format!("failed: {e}"),
                ));
            }
        }
    }
    Outcome {
        number: NUMBER,
        title: TITLE,
        method: method(),
        figures,
        goal: format!(
            "on each kernel: {GOAL_LOST} events lost at full speed, the programs' run time \
             per pod created ≤ {}% of the node's CPU per pod in the agent's configuration \
             and ≤ {}% with every program attached (medians of batches, each interval \
             clear of its line)",
            pod_share::GOAL_AGENT,
            pod_share::GOAL_ALL
        ),
        verdict: format!("{}: {}", Verdict::all(verdicts).word(), texts.join("; ")),
        samples: json!({
            "kernels": runs.iter().map(|(k, m)| match m {
                Ok(m) => json!({"kernel": k.name, "measured": m, "pods": m.pods.samples()}),
                Err(e) => json!({"kernel": k.name, "error": e}),
            }).collect::<Vec<Value>>(),
        }),
    }
}

/// One kernel's verdict: no event lost at full speed, and the lines on pods; the run time
/// per hit is reported (an emulated CPU's nanoseconds say nothing of a real one's).
fn judged(m: &KernelShares) -> (Verdict, String) {
    let loss = &m.counted.summary;
    let lost_v = if loss.lost > GOAL_LOST {
        Verdict::Missed
    } else {
        Verdict::Met
    };
    // Benchmark 4 judges its kernels' pods beside its other lines; here they are half
    // of what a kernel is judged on, and not measuring them decides nothing.
    let (pods_v, pods_text) = match &m.pods {
        PodShares::NotMeasured(why) => (
            Verdict::Undecided,
            format!("the programs' share of the node's CPU per pod not measured: {why}"),
        ),
        measured => measured.judged(),
    };
    let v = Verdict::all([lost_v, pods_v]);
    (
        v,
        format!(
            "{}: {} of {} events lost at full speed; {pods_text}",
            v.word(),
            loss.lost,
            loss.events + loss.lost
        ),
    )
}

/// What the kernel gave the probes and what they cost per hit there.
fn kernel_figures(m: &KernelShares) -> Vec<Figure> {
    let loss = &m.counted.summary;
    let hooks = loss.netns_hooks.as_deref().unwrap_or("not said");
    let cni = match &loss.cni_output {
        Some(v) => v
            .get("how")
            .or_else(|| v.get("off"))
            .and_then(Value::as_str)
            .unwrap_or("not said")
            .to_string(),
        None => "not said".into(),
    };
    let worst = worst_per_hit(&loss.programs).map_or_else(
        || "no program run time counted".to_string(),
        |(name, ns)| format!("{ns:.0} ns ({name})"),
    );
    vec![
        Figure::new(
            "hooks: the namespace programs / CNI output capture",
            format!("{hooks} / {cni}"),
        ),
        Figure::new(
            &format!(
                "{} s at full speed ({} workers exec `{}`): execs/s, events, lost",
                LOSS_RUN.as_secs(),
                m.workers,
                m.target
            ),
            format!(
                "{:.0}, {}, {}",
                rate(&[m.counted.run]),
                loss.events,
                loss.lost
            ),
        ),
        Figure::new(
            "worst program run time per hit (emulated CPU: reported, not judged)",
            worst,
        ),
        Figure::new(
            "kernel.bpf_stats_enabled before the run",
            m.stats_before.clone(),
        ),
    ]
}

fn method() -> String {
    format!(
        "Benchmark 4's measurements that the kernel accounts, on each other kernel of the \
         matrix ({}), each booted in the modern node's QEMU guest (its userland, containerd \
         2.x and runc from Debian, the lab's registry forwarded), the host's and 6.12's \
         being benchmark 4's: `podlapse kernel-events` with every program attached for \
         {} s of the exec workload at full speed (events and losses from its summary, run \
         time per hit from the kernel's BPF statistics, on for these runs only), then the \
         lines on pods as benchmark 4 measures them on the modern node. Run on request \
         (`cargo xtask bench --only {NUMBER}`): its three guests take about half an hour, \
         which the full run's bound leaves no room for; a full run keeps this section as \
         that run wrote it.",
        list(&kernels().collect::<Vec<_>>(), ", ", |k| k.to_string()),
        LOSS_RUN.as_secs(),
    )
}

#[cfg(test)]
mod tests {
    use super::super::pod_share::tests::measured;
    use super::super::report::tests::summary;
    use super::super::{ArmRun, Counted};
    use super::*;
    use crate::bench::assert_has;

    fn shares(lost: u64, pods: PodShares) -> KernelShares {
        let mut s = summary(1000, lost, &[("sched_process_exec", 4_000_000, 2000)]);
        s.netns_hooks = Some("fentry".into());
        s.cni_output = Some(json!({"off": "no bpf_probe_write... none"}));
        let run = ArmRun {
            execs: 600,
            seconds: 60.0,
        };
        KernelShares {
            kernel: "5.10.0-32-cloud-amd64".into(),
            workers: 2,
            target: "/opt/podlapse-bench/busybox true".into(),
            stats_before: "0".into(),
            counted: Counted {
                run,
                summary: s.clone(),
                said: vec![],
                irq_work: None,
                paused_run: run,
                paused: s.clone(),
                agent: s,
            },
            pods,
        }
    }

    #[test]
    fn a_kernel_that_loses_events_misses_and_a_failed_one_stays_undecided() {
        let k = kernels().collect::<Vec<_>>();
        let runs = vec![
            (k[0], Ok(shares(0, measured(4, 16)))),
            (k[1], Ok(shares(3, measured(4, 16)))),
            (k[2], Err("the guest did not boot".to_string())),
        ];
        let o = render(&runs);
        assert_eq!(o.number, NUMBER);
        assert!(o.verdict.starts_with("missed: "), "{}", o.verdict);
        assert_has(
            &o.verdict,
            &[
                "kernel 5.10 (5.10.0-32-cloud-amd64): met: 0 of 1000 events lost",
                "agent's configuration, met: median share 0.20%",
                "missed: 3 of 1003 events lost",
                "kernel 7.2: not measured: the guest did not boot",
            ],
        );
        let names: Vec<&str> = o.figures.iter().map(|f| f.name.as_str()).collect();
        assert!(
            names.contains(&"kernel 5.10: hooks: the namespace programs / CNI output capture"),
            "{names:?}"
        );
        let worst = o
            .figures
            .iter()
            .find(|f| f.name.starts_with("kernel 6.1: worst"))
            .expect("6.1's run time per hit");
        assert_eq!(worst.value, "2000 ns (sched_process_exec)");
    }

    #[test]
    fn every_kernel_met_is_met_and_pods_not_measured_decide_nothing() {
        let k = kernels().collect::<Vec<_>>();
        let runs: Vec<_> = k
            .iter()
            .map(|k| (*k, Ok(shares(0, measured(4, 16)))))
            .collect();
        let o = render(&runs);
        assert!(o.verdict.starts_with("met: "), "{}", o.verdict);
        // Over the agent's line on one kernel: missed there, and so overall.
        let mut over = runs.clone();
        over[1].1 = Ok(shares(0, measured(30, 16)));
        assert!(render(&over).verdict.starts_with("missed: "));
        let mut none = runs.clone();
        none[2].1 = Ok(shares(0, PodShares::NotMeasured("no image".into())));
        let o = render(&none);
        assert!(o.verdict.starts_with("undecided: "), "{}", o.verdict);
        assert_has(&o.verdict, &["per pod not measured: no image"]);
        // The matrix's other kernels, and not the modern node's own.
        assert_eq!(
            k.iter().map(|k| k.name).collect::<Vec<_>>(),
            ["5.10", "6.1", "7.2"]
        );
    }
}
