//! Benchmark 4's report: the figures, verdict, method text and samples.json from what
//! [`super::measure`] measured.

use serde_json::json;
use xtask::text::list;

use super::super::sequential::Verdict;
use super::super::{Figure, Outcome};
use super::pod_share::{self, PodShares};
use super::verdict::judged;
use super::{
    AGENT_RULE, AGENT_RUN, ALL_ON_RULE, ARM, Alternated, Arm, ArmRun, Counted, GOAL_LOST,
    GOAL_NS_PER_HIT, Kernel, LOSS_RUN, Measured, PAUSED_EXECS, PAUSED_RING_BYTES, ProgramRun,
    SETTLE, SPLIT_RULE, Split, Summary, WARMUP, joined, program_row, rate,
};

/// Each kernel's run: what it measured, or why it could not.
pub(super) type KernelRun = (Kernel, Result<Measured, String>, PodShares);

/// The figures, verdict, method and samples of a run on one or more kernels: the goals
/// hold on every kernel, and a kernel whose run failed leaves them undecided at best.
pub(super) fn render(runs: &[KernelRun]) -> Outcome {
    let mut figures = Vec::new();
    let mut verdicts = Vec::new();
    let mut texts = Vec::new();
    for (kernel, measured, pods) in runs {
        match measured {
            Ok(m) => {
                let label = format!("{} (kernel {})", kernel.label(), m.kernel);
                let (v, text) = judged(m);
                let (pods_v, pods_text) = pods.judged();
                verdicts.push(Verdict::all([v, pods_v]));
                texts.push(format!(
                    "{label}: {}, {pods_text}; {}",
                    v.word(),
                    text.split_once(": ").map_or(text.as_str(), |t| t.1)
                ));
                figures.extend(
                    pods.figures()
                        .into_iter()
                        .chain(ratio_figures(m))
                        .chain(split_figures(m))
                        .chain(counted_figures(m))
                        .map(|f| Figure::new(&format!("{}: {}", kernel.label(), f.name), f.value)),
                );
            }
            Err(e) => {
                verdicts.push(Verdict::Undecided);
                texts.push(format!("{}: not measured: {e}", kernel.label()));
                figures.push(Figure::new(
                    &format!("{}: the run", kernel.label()),
                    format!("failed: {e}"),
                ));
            }
        }
    }
    let first = runs.iter().find_map(|(_, m, _)| m.as_ref().ok());
    Outcome {
        number: 4,
        title: "Probe overhead",
        method: first.map_or_else(String::new, |m| method(m, runs)),
        figures,
        goal: format!(
            "the programs' run time per pod created ≤ {}% of the node's CPU per pod in the \
             agent's configuration and ≤ {}% with every program attached (medians of \
             batches, each interval clear of its line), {GOAL_LOST} lost events, ≤ \
             {GOAL_NS_PER_HIT:.0} ns per hit on the host",
            pod_share::GOAL_AGENT,
            pod_share::GOAL_ALL
        ),
        verdict: format!("{}: {}", Verdict::all(verdicts).word(), texts.join("; ")),
        samples: json!({
            "kernels": runs.iter().map(|(kernel, m, pods)| match m {
                Ok(m) => json!({
                    "kernel": kernel.label(),
                    "release": m.kernel,
                    "run": samples(m),
                    "pods": pods.samples(),
                }),
                Err(e) => json!({"kernel": kernel.label(), "error": e, "pods": pods.samples()}),
            }).collect::<Vec<_>>(),
        }),
    }
}

/// The alternating rounds' figures: each mode's ratio per round, median, pooled and
/// interval, and the events lost in the arms.
fn ratio_figures(m: &Measured) -> Vec<Figure> {
    let (on_rate, off_rate) = (m.agent.rate(Arm::On), m.agent.rate(Arm::Off));
    let mut figures = vec![Figure::new(
        "execs/s with the probes / without (all arms pooled)",
        format!("{on_rate:.0} / {off_rate:.0}"),
    )];
    figures.extend(mode_figures(
        &m.agent,
        "the agent's probes (namespace programs detached between sandbox operations)",
        "the agent's probes",
        "",
    ));
    figures.extend(mode_figures(
        &m.all_on,
        "every program attached (during sandbox operations, and kernel-events)",
        "every program attached",
        " more",
    ));
    let (arms_lost, arms_events) = (m.agent.summed(|s| s.lost), m.agent.summed(|s| s.events));
    figures.push(Figure::new(
        "events lost in the alternating arms",
        format!("{arms_lost} of {}", arms_events + arms_lost),
    ));
    figures
}

/// The every-program cost in its parts: each part's share of untraced execs/s (one minus
/// the median ratio of its series), its interval, and whether the interval tells it from
/// nothing.
fn split_figures(m: &Measured) -> Vec<Figure> {
    let Some(Split {
        syscall_tracepoints,
        kernel,
        programs,
        reader,
    }) = &m.split
    else {
        return vec![Figure::new(
            "every program attached, in wall-clock parts",
            "not run on this kernel: the programs' run time (BPF statistics), the \
             reader's CPU and the syscall tracepoints' slow path are its parts as the \
             kernel accounts them"
                .into(),
        )];
    };
    let part = |a: &Alternated| -> String {
        let d = &a.decision;
        let share = |r: f64| (1.0 - r) * 100.0;
        let interval = d.interval.map_or_else(
            || "no interval".to_string(),
            |(lo, hi)| format!("{:.1} to {:.1}%", share(hi), share(lo)),
        );
        let told = match d.verdict {
            Verdict::Missed => "a cost",
            Verdict::Met => "no cost",
            Verdict::Undecided => "not told from nothing",
        };
        format!(
            "{:.1}% ({interval}: {told}; {} rounds)",
            share(d.median),
            d.rounds
        )
    };
    let mut figures = vec![Figure::new(
        "every program attached, in parts (share of untraced execs/s, 95% interval)",
        format!(
            "the kernel's syscall tracepoints {}; the programs, their reader paused {}; \
             the reader's wakeups, decoding and attribution {}",
            kernel.as_ref().map_or_else(
                || "none (no syscall tracepoint under the programs)".to_string(),
                part
            ),
            part(programs),
            part(reader)
        ),
    )];
    if let Some(kernel) = kernel {
        figures.push(Figure::new(
            &format!(
                "the kernel's part: {} enabled with no program, against untraced: ratio per \
                 round",
                syscall_tracepoints.join(", ")
            ),
            joined(&kernel.round_ratios()),
        ));
    }
    figures.push(Figure::new(
        &format!(
            "the programs' part: every program attached, reader paused, against {}: ratio \
             per round",
            if kernel.is_some() {
                "those tracepoints alone"
            } else {
                "untraced"
            }
        ),
        joined(&programs.round_ratios()),
    ));
    figures.push(Figure::new(
        "the reader's part: every program attached and read, against the reader paused: \
         ratio per round",
        joined(&reader.round_ratios()),
    ));
    // The paused arms are the programs' series' on arms and the reader's series' off arms.
    let paused_lost = lost_in(programs, Arm::On) + lost_in(reader, Arm::Off);
    if paused_lost > 0 {
        figures.push(Figure::new(
            "events lost with the reader paused",
            format!(
                "{paused_lost}: the ring filled, so those arms' programs stopped short at \
                 the reservation and the split understates them"
            ),
        ));
    }
    figures
}

/// One mode's figures: its ratio per round, the median (the verdict's, or shown beside
/// it) and the pooled ratio, and the interval of its rule's last look.
fn mode_figures(a: &Alternated, title: &str, short: &str, more: &str) -> [Figure; 3] {
    let d = &a.decision;
    [
        Figure::new(
            &format!("{title}: ratio per round ({}{more} rounds)", d.rounds),
            joined(&a.round_ratios()),
        ),
        Figure::new(
            &format!("{short}: median of rounds / pooled"),
            format!("{:.3}× / {:.3}×", d.median, a.pooled()),
        ),
        Figure::new(
            &format!("{short}: 95% confidence interval of the median"),
            d.interval_text(),
        ),
    ]
}

/// Events lost in the arms of one kind of a series.
fn lost_in(a: &Alternated, which: Arm) -> u64 {
    a.rounds
        .iter()
        .flatten()
        .filter(|(arm, _, _)| *arm == which)
        .filter_map(|(_, _, s)| s.as_ref().map(|s| s.lost))
        .sum()
}

/// The counted runs' figures: events and losses at full speed, each program's run time
/// per hit, the reader's wakeups and CPU, and the probes' share of an exec.
fn counted_figures(m: &Measured) -> Vec<Figure> {
    let Counted {
        run: loss_run,
        summary: loss,
        irq_work,
        paused,
        agent: agent_counted,
        ..
    } = &m.counted;
    let mut figures = vec![Figure::new(
        &format!(
            "{} s at full speed: execs/s, events read, lost",
            LOSS_RUN.as_secs()
        ),
        format!(
            "{:.0}, {}, {}{}",
            rate(&[*loss_run]),
            loss.events,
            loss.lost,
            if loss.lost_by_kind.is_empty() {
                String::new()
            } else {
                format!(
                    " ({})",
                    list(&loss.lost_by_kind, ", ", |(k, n)| format!("{k} {n}"))
                )
            }
        ),
    )];
    let paused_valid = paused.lost == 0;
    for p in &loss.programs {
        let quiet = paused
            .programs
            .iter()
            .find(|q| q.program == p.program)
            .filter(|_| paused_valid);
        figures.push(Figure::new(
            &format!(
                "`{}`: hits, run time per hit (with the reader paused)",
                p.program
            ),
            program_row(p, quiet),
        ));
    }
    for p in agent_counted
        .programs
        .iter()
        .filter(|p| p.program.starts_with("sched_process"))
    {
        figures.push(Figure::new(
            &format!(
                "`{}` as the agent runs it between sandbox operations (the node's own \
                 processes dropped in the kernel): hits, run time per hit",
                p.program
            ),
            program_row(p, None),
        ));
    }
    if !paused_valid {
        figures.push(Figure::new(
            "reader-paused run",
            format!(
                "{} events lost: the ring filled, so its run times are not shown",
                paused.lost
            ),
        ));
    }
    if let Some(n) = irq_work {
        figures.push(Figure::new(
            &format!(
                "IRQ work interrupts in the {} s run (machine-wide: every ring buffer's wakeups)",
                LOSS_RUN.as_secs()
            ),
            format!(
                "{n}, {:.2} per event read",
                *n as f64 / loss.events.max(1) as f64
            ),
        ));
    }
    figures.push(reader_cpu_figure(&m.agent));
    let probe_ns: u64 = loss.programs.iter().map(|p| p.run_time_ns).sum();
    let probe_ns_per_exec = probe_ns as f64 / loss_run.execs as f64;
    // At the ceiling every CPU is busy, so one exec costs workers / rate CPU-seconds.
    let cpu_ns_per_exec = m.workers as f64 * 1e9 / rate(&[*loss_run]);
    figures.push(Figure::new(
        "probe run time per exec (all programs) / CPU time per exec at the ceiling",
        format!(
            "{:.2} µs / {:.1} µs ({:.1}%)",
            probe_ns_per_exec / 1e3,
            cpu_ns_per_exec / 1e3,
            probe_ns_per_exec * 100.0 / cpu_ns_per_exec
        ),
    ));
    if !m.others.is_empty() {
        figures.push(Figure::new(
            "other tracepoint programs loaded during the run (in both arms)",
            m.others.join(", "),
        ));
    }
    figures
}

/// The reader's CPU in the agent's on arms: share of one CPU, and per event read.
fn reader_cpu_figure(agent: &Alternated) -> Figure {
    let arms_events = agent.summed(|s| s.events);
    let share = agent.reader_ns as f64 / 1e7 / agent.on_seconds.max(f64::EPSILON);
    Figure::new(
        "the reader's CPU in the on arms (kernel-events, all threads): share of one CPU, per \
         event",
        if arms_events == 0 {
            format!("{share:.2}%, no events (every one dropped in the kernel)")
        } else {
            format!(
                "{share:.2}%, {:.2} µs",
                agent.reader_ns as f64 / 1e3 / arms_events as f64
            )
        },
    )
}

/// How the figures were made, for BENCHMARKS.md.
fn method(m: &Measured, runs: &[KernelRun]) -> String {
    let caps = runs
        .iter()
        .filter_map(|(k, m, _)| Some((k.label(), m.as_ref().ok()?.cap?)))
        .map(|(k, n)| format!("on the {k} at {n} rounds"))
        .collect::<Vec<_>>();
    let kernels = runs
        .iter()
        .map(|(k, m, _)| match m {
            Ok(m) => format!("{} ({})", k.label(), m.kernel),
            Err(_) => k.label().to_string(),
        })
        .collect::<Vec<_>>()
        .join(" and ");
    let lines = format!(
        "{} The rest is the exec workload's, which gives the programs' run time per hit, \
         the events lost, and the wall-clock ratios, context that decides nothing: ",
        pod_share::method()
    );
    lines
        + &format!(
            "On each kernel ({kernels}; the modern node is its QEMU guest under software \
         emulation, where this xtask binary, podlapse's release build and the host's \
         busybox are copied in, and the figures come back as JSON): {} workers (one per \
         CPU) each `posix_spawn` `{}` and wait for it, in a \
         loop, as fast as they can. With the probes on, `podlapse kernel-events \
         --summary-only --json --netns-on-demand` (release build) has loaded every program \
         and attached them as the agent does between the CRI calls that create or enter \
         pod namespaces (the namespace programs loaded but detached: \
         the agent attaches them around RunPodSandbox, StopPodSandbox, RemovePodSandbox, \
         CreateContainer and StartContainer, and detaches them after a second without \
         such a call), and drains the ring buffer with the agent's reader (events \
         decoded and received, not printed); off, nothing is attached. After a {} s \
         warm-up the workload runs on without a break through rounds of four \
         arms in ABBA then BAAB order, and an arm is the execs counted in a {:.1} s window \
         that opens {} ms after the arm begins: an on arm starts kernel-events as it \
         begins and stops it after its window, so neither the probes' attaching nor \
         their removal falls in a window (in the second after kernel-events attached \
         the agent's programs, the workload ran up to 10% slower), and no arm starts \
         from an idle machine. A round's ratio \
         is its on arms' execs/s over its off arms', and the verdict uses the median of \
         the rounds' ratios (the pooled ratio is shown too). {} More rounds with every \
         program attached (the agent during sandbox operations, and kernel-events) are \
         judged the same way against their own line: first look at {}, then every {}, \
         at most {}. On request (`--probe-split`, host only), the every-program cost is \
         then split into wall-clock parts, each a series of \
         its own two arms side by side, {}, until its interval is clear of 1 (the part \
         told from nothing): the kernel's (the syscall tracepoints the programs sit on, \
         enabled as counting perf events with no program, against untraced: enabling \
         any syscall tracepoint sends every syscall on the node through the kernel's \
         slow entry and exit path, whatever the programs do; absent where the namespace \
         programs hook kernel functions), the programs' (every program attached with \
         kernel-events stopped by SIGSTOP a second after attaching, so no reader runs, \
         against those tracepoints alone, or untraced; with a {} MiB ring so that no \
         event of a window is lost), and the reader's (every program attached and read, \
         against the reader paused). The probes' load time is not \
         timed. Then {} s at full speed with every program attached counts events read \
         and lost. \
         The kernel's BPF statistics (BPF_ENABLE_STATS, released afterwards) are on for \
         that run and one before it only (kernel.bpf_stats_enabled was {} \
         before the benchmark), and give each program's run time per hit. In the run \
         before it, kernel-events is stopped (SIGSTOP) while the workload runs \
         {PAUSED_EXECS} execs, so the probes run their full paths but never wake a \
         reader: its run time per hit, in parentheses, is the programs' own, and the \
         difference is the ring buffer's wakeup of the reader (IRQ work, counted from \
         /proc/interrupts). A last {} s run with the statistics on, in the agent's \
         configuration, gives the exec and exit programs' run time per hit there: between \
         sandbox operations the probes drop the node's own execs and exits (this \
         workload's) in the kernel, before reserving anything. The per-hit goal is judged \
         on the run with every program attached.{}",
            m.workers,
            m.target,
            WARMUP.as_secs(),
            ARM.as_secs_f64(),
            SETTLE.as_millis(),
            AGENT_RULE.describe(),
            ALL_ON_RULE.min_rounds,
            ALL_ON_RULE.batch,
            ALL_ON_RULE.cap,
            SPLIT_RULE.schedule(),
            PAUSED_RING_BYTES >> 20,
            LOSS_RUN.as_secs(),
            m.stats_before,
            AGENT_RUN.as_secs(),
            if caps.is_empty() {
                String::new()
            } else {
                format!(
                    " This run capped every series {} (`--probe-rounds-cap`): a verdict the cap \
                 cut short says undecided.",
                    caps.join(" and ")
                )
            }
        )
}

/// Every raw figure, for samples.json.
fn samples(m: &Measured) -> serde_json::Value {
    let Counted {
        run: loss_run,
        summary: loss,
        said: loss_reports,
        irq_work,
        paused_run,
        paused,
        ..
    } = &m.counted;
    json!({
        "workers": m.workers,
        "exec_target": m.target,
        "arm_seconds": ARM.as_secs_f64(),
        "warmup": {"execs": m.warm.execs, "seconds": m.warm.seconds},
        "rounds": rounds_json(&m.agent),
        "decision": m.agent.decision.to_json(),
        "all_attached_rounds": rounds_json(&m.all_on),
        "all_attached_decision": m.all_on.decision.to_json(),
        "split": {
            "syscall_tracepoints": m.split.as_ref().map(|s| &s.syscall_tracepoints),
            "kernel_rounds": m.split.as_ref().and_then(|s| s.kernel.as_ref()).map(rounds_json),
            "kernel_decision": m
                .split
                .as_ref()
                .and_then(|s| s.kernel.as_ref())
                .map(|a| a.decision.to_json()),
            "programs_rounds": m.split.as_ref().map(|s| rounds_json(&s.programs)),
            "programs_decision": m.split.as_ref().map(|s| s.programs.decision.to_json()),
            "reader_rounds": m.split.as_ref().map(|s| rounds_json(&s.reader)),
            "reader_decision": m.split.as_ref().map(|s| s.reader.decision.to_json()),
        },
        "median_ratio": m.agent.decision.median,
        "pooled_ratio": m.agent.pooled(),
        "reader_cpu_ns_in_on_arms": m.agent.reader_ns,
        "on_arm_seconds": m.agent.on_seconds,
        "loss_run": {
            "execs": loss_run.execs,
            "seconds": loss_run.seconds,
            "events": loss.events,
            "undecodable": loss.undecodable,
            "lost": loss.lost,
            "lost_by_kind": loss.lost_by_kind,
            "loss_reports": loss_reports.iter()
                .filter(|l| l.contains("lost"))
                .collect::<Vec<_>>(),
            "programs": programs_json(&loss.programs),
        },
        "irq_work_interrupts_in_loss_run": irq_work,
        "reader_paused_run": {
            "execs": paused_run.execs,
            "seconds": paused_run.seconds,
            "events": paused.events,
            "lost": paused.lost,
            "programs": programs_json(&paused.programs),
        },
        "bpf_stats_enabled": {
            "before": m.stats_before,
            "after": m.stats_after,
        },
        "other_tracepoint_programs": m.others,
    })
}

/// Each round's arms and ratio, for samples.json.
fn rounds_json(a: &Alternated) -> Vec<serde_json::Value> {
    let arm_json = |(a, r, s): &(Arm, ArmRun, Option<Summary>)| {
        json!({
            "arm": a.name(),
            "execs": r.execs,
            "seconds": r.seconds,
            "events": s.as_ref().map(|s| s.events),
            "lost": s.as_ref().map(|s| s.lost),
        })
    };
    a.rounds
        .iter()
        .zip(a.round_ratios())
        .enumerate()
        .map(|(i, (arms, r))| {
            json!({
                "round": i + 1,
                "arms": arms.iter().map(arm_json).collect::<Vec<_>>(),
                "ratio": r,
            })
        })
        .collect()
}

/// Each program's counters and run time per hit, for samples.json.
fn programs_json(programs: &[ProgramRun]) -> Vec<serde_json::Value> {
    programs
        .iter()
        .map(|p| {
            json!({
                "program": p.program,
                "run_time_ns": p.run_time_ns,
                "run_count": p.run_count,
                "ns_per_hit": p.ns_per_hit(),
            })
        })
        .collect()
}

#[cfg(test)]
pub(super) mod tests {
    use super::super::super::sequential::Rule;
    use super::super::{GOAL_ALL_RATIO, GOAL_RATIO};
    use super::*;
    use crate::bench::assert_has;

    pub(crate) fn program(name: &str, run_time_ns: u64, run_count: u64) -> ProgramRun {
        ProgramRun {
            program: name.to_string(),
            run_time_ns,
            run_count,
        }
    }

    pub(crate) fn summary(events: u64, lost: u64, programs: &[(&str, u64, u64)]) -> Summary {
        Summary {
            kind: "summary".into(),
            ebpf: true,
            events,
            undecodable: 0,
            lost,
            lost_by_kind: Default::default(),
            programs: programs
                .iter()
                .map(|(p, t, n)| program(p, *t, *n))
                .collect(),
            netns_hooks: None,
            cni_output: None,
        }
    }

    /// 16 rounds whose on arms all ran at `ratio` of their off arms, judged against `line`;
    /// each on arm's kernel-events lost `lost` events.
    fn series(line: f64, ratio: f64, lost: u64) -> Alternated {
        let arm = |which, execs, summary| {
            (
                which,
                ArmRun {
                    execs,
                    seconds: 1.0,
                },
                summary,
            )
        };
        let rounds: Vec<_> = (0..16)
            .map(|_| {
                let execs = (1000.0 * ratio).round() as u64;
                let on = arm(Arm::On, execs, Some(summary(100, lost, &[])));
                let off = arm(Arm::Off, 1000, None);
                vec![on.clone(), off.clone(), off, on]
            })
            .collect();
        Alternated {
            rounds,
            decision: Rule::new(line, 16, 16, 16).decide(&[ratio; 16]),
            reader_ns: 0,
            on_seconds: 32.0,
        }
    }

    pub(crate) fn measured(kernel: &str, all_on: f64, tracepoints: Option<f64>) -> Measured {
        let counted_run = ArmRun {
            execs: 3000,
            seconds: 1.0,
        };
        let programs = [("sched_process_exec", 400_000, 1000)];
        Measured {
            kernel: kernel.into(),
            emulated: false,
            cap: None,
            workers: 2,
            target: "/bin/busybox true".into(),
            others: vec![],
            stats_before: "0".into(),
            stats_after: "0".into(),
            warm: counted_run,
            agent: series(GOAL_RATIO, 0.995, 0),
            all_on: series(GOAL_ALL_RATIO, all_on, 0),
            split: Some(Split {
                syscall_tracepoints: tracepoints
                    .map(|_| vec!["sys_enter_unshare".to_string()])
                    .unwrap_or_default(),
                kernel: tracepoints.map(|r| series(1.0, r, 0)),
                programs: series(1.0, 0.97, 0),
                reader: series(1.0, 1.0, 0),
            }),
            counted: Counted {
                run: counted_run,
                summary: summary(2000, 0, &programs),
                said: vec![],
                irq_work: Some(10),
                paused_run: counted_run,
                paused: summary(200, 0, &programs),
                agent: summary(0, 0, &programs),
            },
            pods: None,
        }
    }

    /// A kernel's run without the lines on pods.
    fn no_pods() -> PodShares {
        PodShares::NotMeasured("no lab".into())
    }

    #[test]
    fn what_the_modern_node_measured_comes_back_whole_through_json() {
        let mut m = measured("6.12.57+deb13-cloud-amd64", 0.99, None);
        m.emulated = true;
        let text = serde_json::to_string(&m).unwrap();
        let back: Measured = serde_json::from_str(&text).unwrap();
        assert_eq!(serde_json::to_string(&back).unwrap(), text);
        // And renders as the host's own would.
        let from_json = render(&[(Kernel::Node, Ok(back), no_pods())]);
        let direct = render(&[(Kernel::Node, Ok(m), no_pods())]);
        assert_eq!(from_json.verdict, direct.verdict);
    }

    #[test]
    fn the_goals_hold_on_every_kernel_and_an_unmeasured_one_is_never_met() {
        let both = render(&[
            (
                Kernel::Host,
                Ok(measured("6.18.44", 0.99, Some(0.99))),
                no_pods(),
            ),
            (Kernel::Node, Ok(measured("6.12.57", 0.99, None)), no_pods()),
        ]);
        assert!(
            both.verdict
                .starts_with("met: host (kernel 6.18.44): met, "),
            "{}",
            both.verdict
        );
        assert_has(&both.verdict, &["; modern node (kernel 6.12.57): met, "]);
        // Every figure says whose kernel it is.
        assert!(
            both.figures
                .iter()
                .all(|f| f.name.starts_with("host: ") || f.name.starts_with("modern node: ")),
        );

        let one_failed = render(&[
            (
                Kernel::Host,
                Ok(measured("6.18.44", 0.99, Some(0.99))),
                no_pods(),
            ),
            (
                Kernel::Node,
                Err("the guest did not boot".into()),
                no_pods(),
            ),
        ]);
        assert!(
            one_failed
                .verdict
                .starts_with("undecided: host (kernel 6.18.44): met, "),
            "{}",
            one_failed.verdict
        );
        assert!(
            one_failed
                .verdict
                .ends_with("; modern node: not measured: the guest did not boot"),
            "{}",
            one_failed.verdict
        );
        // The host's figures stay.
        assert!(
            one_failed
                .figures
                .iter()
                .any(|f| f.name.starts_with("host: "))
        );

        // A kernel that misses makes the whole missed (a ratio below its old line
        // does not: it is context).
        let mut lossy = measured("6.18.44", 0.92, Some(0.99));
        lossy.counted.summary = summary(1990, 10, &[("sched_process_exec", 400_000, 1000)]);
        let missed = render(&[
            (Kernel::Host, Ok(lossy), no_pods()),
            (Kernel::Node, Ok(measured("6.12.57", 0.99, None)), no_pods()),
        ]);
        assert!(
            missed.verdict.starts_with("missed: host"),
            "{}",
            missed.verdict
        );
    }

    #[test]
    fn run_time_per_hit_is_judged_on_a_real_cpu_only() {
        let mut m = measured("6.12.57", 0.99, None);
        m.counted.summary = summary(2000, 0, &[("sched_process_exec", 32_000_000, 1000)]);
        let real = render(&[(Kernel::Node, Ok(m.clone()), no_pods())]);
        assert!(real.verdict.starts_with("missed: "), "{}", real.verdict);
        assert!(
            real.verdict
                .contains("; sched_process_exec at 32000 ns per hit is 31500 ns over 500 ns;"),
            "{}",
            real.verdict
        );
        m.emulated = true;
        let emulated = render(&[(Kernel::Node, Ok(m), no_pods())]);
        assert!(
            emulated.verdict.starts_with("met: "),
            "{}",
            emulated.verdict
        );
        assert!(
            emulated.verdict.contains(
                "worst 32000 ns per hit (sched_process_exec) on an emulated CPU, not judged;"
            ),
            "{}",
            emulated.verdict
        );
    }

    #[test]
    fn the_split_names_each_part_and_whether_its_interval_tells_it_from_nothing() {
        let host = split_figures(&measured("6.18.44", 0.92, Some(0.98)));
        let parts = &host[0].value;
        assert!(
            parts.starts_with(
                "the kernel's syscall tracepoints 2.0% (2.0 to 2.0%: a cost; 16 rounds)"
            ),
            "{parts}"
        );
        assert_has(
            parts,
            &["the programs, their reader paused 3.0% (3.0 to 3.0%: a cost"],
        );
        assert!(
            parts.ends_with(
                "the reader's wakeups, decoding and attribution 0.0% (0.0 to 0.0%: no cost; \
                 16 rounds)"
            ),
            "{parts}"
        );
        assert_has(&host[2].name, &["against those tracepoints alone"]);

        // A part whose interval still holds 1 at the cap is not told from nothing.
        let mut m = measured("6.18.44", 0.92, Some(0.98));
        let straddling: Vec<f64> = [0.97, 1.03].iter().copied().cycle().take(16).collect();
        m.split.as_mut().unwrap().reader.decision = Rule::new(1.0, 16, 16, 16).decide(&straddling);
        let parts = &split_figures(&m)[0].value;
        assert!(
            parts.ends_with("attribution 0.0% (-3.0 to 3.0%: not told from nothing; 16 rounds)"),
            "{parts}"
        );

        // Without syscall tracepoints (namespace programs on kernel functions), the
        // programs are measured against untraced and there is no kernel's part.
        let node = split_figures(&measured("6.12.57", 0.97, None));
        assert!(
            node[0]
                .value
                .starts_with("the kernel's syscall tracepoints none (no syscall tracepoint"),
            "{}",
            node[0].value
        );
        assert_has(&node[1].name, &["against untraced"]);
        assert_eq!(node.len(), 3);
    }

    #[test]
    fn events_lost_with_the_reader_paused_are_said_never_hidden() {
        let mut m = measured("6.18.44", 0.92, None);
        m.split.as_mut().unwrap().programs = series(1.0, 0.97, 5);
        let figures = split_figures(&m);
        let lost = figures.last().unwrap();
        assert_eq!(lost.name, "events lost with the reader paused");
        // 16 rounds of two paused (on) arms, 5 each.
        assert!(
            lost.value.starts_with("160: the ring filled"),
            "{}",
            lost.value
        );
    }
}
