//! Benchmark 4's report: the figures, verdict, method text and samples.json from what
//! [`super::measure`] measured.

use serde_json::json;

use super::super::{Figure, Outcome};
use super::verdict::verdict;
use super::{
    AGENT_RULE, AGENT_RUN, ALL_ON_RULE, ARM, Alternated, Arm, ArmRun, Counted, GOAL_ALL_RATIO,
    GOAL_LOST, GOAL_NS_PER_HIT, GOAL_RATIO, LOSS_RUN, Measured, PAUSED_EXECS, ProgramRun, SETTLE,
    Summary, TRACEPOINTS_ALONE, WARMUP, joined, program_row, rate, worst_per_hit,
};

/// The figures, verdict, method and samples of a run.
pub(super) fn render(m: &Measured) -> Outcome {
    let loss = &m.counted.summary;
    let verdict = verdict(
        &m.agent.decision,
        &m.all_on.decision,
        m.tracepoints_alone.as_ref().map(|a| a.decision.median),
        loss.lost,
        loss.events,
        worst_per_hit(&loss.programs),
    );
    let mut figures = ratio_figures(m);
    figures.extend(counted_figures(m));
    Outcome {
        number: 4,
        title: "Probe overhead",
        method: method(m),
        figures,
        goal: format!(
            "workload ≥ {GOAL_RATIO}× of untraced in the agent's configuration and \
             ≥ {GOAL_ALL_RATIO}× with every program attached (medians of rounds, each \
             interval clear of its line), {GOAL_LOST} \
             lost events, ≤ {GOAL_NS_PER_HIT:.0} ns per hit"
        ),
        verdict,
        samples: samples(m),
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
    if let Some(alone) = &m.tracepoints_alone {
        figures.extend(mode_figures(
            alone,
            &format!(
                "the kernel's share: the same syscall tracepoints ({}) enabled with no \
                 program",
                m.syscall_tracepoints.join(", ")
            ),
            "syscall tracepoints alone",
            " more",
        ));
    }
    let (arms_lost, arms_events) = (m.agent.summed(|s| s.lost), m.agent.summed(|s| s.events));
    figures.push(Figure::new(
        "events lost in the alternating arms",
        format!("{arms_lost} of {}", arms_events + arms_lost),
    ));
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
                    loss.lost_by_kind
                        .iter()
                        .map(|(k, n)| format!("{k} {n}"))
                        .collect::<Vec<_>>()
                        .join(", ")
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
fn method(m: &Measured) -> String {
    format!(
        "{} workers (one per CPU) each `posix_spawn` `{}` and wait for it, in a \
         loop, as fast as they can. With the probes on, `podtrace kernel-events \
         --summary-only --json --netns-on-demand` (release build) has loaded every program \
         and attached them as the agent does between the CRI calls that create or enter \
         pod namespaces (the unshare and setns syscall tracepoints loaded but detached: \
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
         at most {}. Then {} rounds with only the syscall \
         tracepoints those programs sit on enabled, as counting perf events with no \
         program: enabling any syscall tracepoint sends every syscall on the node \
         through the kernel's slow entry and exit path, so that share of the cost is \
         the kernel's whatever the programs do. The probes' load time is not \
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
         on the run with every program attached.",
        m.workers,
        m.target,
        WARMUP.as_secs(),
        ARM.as_secs_f64(),
        SETTLE.as_millis(),
        AGENT_RULE.describe(),
        ALL_ON_RULE.min_rounds,
        ALL_ON_RULE.batch,
        ALL_ON_RULE.cap,
        TRACEPOINTS_ALONE.cap,
        LOSS_RUN.as_secs(),
        m.stats_before,
        AGENT_RUN.as_secs()
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
        "tracepoints_alone_rounds": m.tracepoints_alone.as_ref().map(rounds_json),
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
