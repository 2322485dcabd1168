//! How the benchmarks that judge the agent's cost by the kernel's accounting (2, 4, 11)
//! report it: the share's decision, the node's CPU per pod, and the parts of the cost
//! (the agent's process, its programs), so a missed line says where to go next.

use super::Figure;
use super::accounting::{self, RoundCost};
use super::agent_cost::Batch;
use super::sequential::{Decision, Verdict};

/// How the share is measured, for a benchmark's method.
pub fn method() -> String {
    "A batch's share is what the kernel accounted from the manifests' move to the last \
     pod cgroup's removal: the CPU of the agent's cgroup (`/podlapse.bench-agent`: its \
     threads and anything it starts) plus its programs' run time (the kernel's BPF \
     statistics, on for the benchmark), over the node's CPU in the same window: the lab's \
     containerd moved into a cgroup of its own before the agent started (its shims, runc \
     and the CNI plugins are born there), plus the pods' cgroups under `/podlapse`, less \
     the programs' run time (which runs in the tasks that hit the probes, mostly the \
     node's: taking all of it off the node makes the share larger, never smaller). The \
     waits read the kernel's evidence (the pods' processes in their cgroups, the pod \
     cgroups left), never the agent's API; the agent is asked for its timeline (each \
     pod's time to Running) once the pods' processes run, until each shows Running, \
     usually once a batch, and that query's cost is in the share."
        .to_string()
}

/// The figures of one series of batches (`what`: "concurrency 8", say).
pub fn figures(
    what: &str,
    decision: &Decision,
    batches: &[Batch],
    programs_unmeasured: Option<&str>,
) -> Vec<Figure> {
    let costs: Vec<RoundCost> = batches.iter().map(|b| b.cost).collect();
    let med = |f: &dyn Fn(&RoundCost) -> f64| accounting::median_of(&costs, f);
    let per_pod = |ns: u64, c: &RoundCost| ns as f64 / 1e6 / c.pods.max(1) as f64;
    vec![
        Figure::new(
            &format!(
                "{what}: the agent's share of the node's CPU ({} rounds): median (the \
                 verdict's), 95% interval",
                decision.rounds
            ),
            format!(
                "{}, {}",
                decision.rule.show(decision.median),
                decision.interval_text()
            ),
        ),
        Figure::new(
            &format!(
                "{what}: per pod, the node's CPU (the runtime + the pods' cgroups) / the \
                 agent's process / its programs (medians of rounds)"
            ),
            format!(
                "{:.1} ms ({:.1} + {:.1}) / {:.2} ms / {}",
                med(&|c| c.node_ms_per_pod()),
                med(&|c| per_pod(c.runtime_ns, c)),
                med(&|c| per_pod(c.pods_ns, c)),
                med(&|c| per_pod(c.agent_ns, c)),
                match programs_unmeasured {
                    None => format!("{:.3} ms", med(&|c| per_pod(c.programs_ns.unwrap_or(0), c))),
                    Some(why) => format!("not measured: {why}"),
                }
            ),
        ),
        Figure::new(
            &format!(
                "{what}: of the agent's process, what it spends with no pods (relists, \
                 housekeeping, timers) over a batch's window: per pod, its share of the \
                 node's CPU (medians of rounds); the window per pod"
            ),
            match idle_share(batches) {
                Some((ms, pct)) => format!(
                    "{ms:.2} ms, {pct:.2}%; {:.0} ms",
                    super::stats::median(
                        &batches
                            .iter()
                            .map(|b| 1e3 * b.window_s / b.cost.pods.max(1) as f64)
                            .collect::<Vec<_>>()
                    )
                ),
                None => "not measured (no idle window before the batches)".into(),
            },
        ),
    ]
}

/// The agent's idle CPU over the batches' windows: per pod in ms, and as a share of the
/// node's CPU in percent (medians of batches); `None` where it was not measured.
fn idle_share(batches: &[Batch]) -> Option<(f64, f64)> {
    let idle: Vec<(f64, f64)> = batches
        .iter()
        .map(|b| {
            b.agent_idle_ns.map(|ns| {
                (
                    ns as f64 / 1e6 / b.cost.pods.max(1) as f64,
                    accounting::share(ns, b.cost.node_ns()),
                )
            })
        })
        .collect::<Option<_>>()?;
    if idle.is_empty() {
        return None;
    }
    let ms: Vec<f64> = idle.iter().map(|i| i.0).collect();
    let pct: Vec<f64> = idle.iter().map(|i| i.1).collect();
    Some((super::stats::median(&ms), super::stats::median(&pct)))
}

/// The decision in words, with the parts of the cost when the line was missed.
pub fn verdict(
    decision: &Decision,
    batches: &[Batch],
    programs_unmeasured: Option<&str>,
) -> String {
    let costs: Vec<RoundCost> = batches.iter().map(|b| b.cost).collect();
    let med = |f: &dyn Fn(&RoundCost) -> f64| accounting::median_of(&costs, f);
    let idle = idle_share(batches).map(|(_, pct)| pct);
    let process = med(&|c| accounting::share(c.agent_ns, c.node_ns()));
    let programs = med(&|c| c.programs_share().unwrap_or(0.0));
    match (decision.verdict, programs_unmeasured) {
        (Verdict::Missed, None) => format!(
            "{}; of it, {}",
            decision.text(),
            parts(process, Some(programs), idle)
        ),
        (Verdict::Missed, Some(_)) => {
            format!("{}; of it, {}", decision.text(), parts(process, None, idle))
        }
        (_, Some(why)) => format!(
            "{} (the agent's process only: its programs not measured: {why})",
            decision.text()
        ),
        _ => decision.text(),
    }
}

/// "the agent's process 1.90% (0.80% of it idle work) and its programs 0.31% (the larger
/// part: the agent's own work)".
fn parts(process: f64, programs: Option<f64>, idle: Option<f64>) -> String {
    let idle = idle.map_or(String::new(), |i| {
        format!(" ({i:.2}% of it what it spends with no pods over as long)")
    });
    match programs {
        Some(p) => format!(
            "the agent's process {process:.2}%{idle} and its programs {p:.2}% (the larger \
             part: {})",
            if process >= p {
                "the agent's own work"
            } else {
                "the programs"
            }
        ),
        None => format!("the agent's process {process:.2}%{idle} (its programs not measured)"),
    }
}

/// The wall-clock context beside a share: pooled pods/s of the agent's batches and the
/// direct driver's (each batch its slowest pod), and the rounds' ratios judged against
/// `line`, deciding nothing. `what` prefixes the figure's name ("concurrency 8: ").
pub fn context_figure(
    what: &str,
    batches: &[Batch],
    direct_s: &[f64],
    context: &Decision,
    line: f64,
) -> Figure {
    let pods: usize = batches.iter().map(|b| b.cost.pods).sum();
    let agent_s: f64 = batches.iter().map(Batch::slowest_s).sum();
    let direct: f64 = direct_s.iter().sum();
    Figure::new(
        &format!(
            "{what}context: pods/s, podlapse / direct (pooled); round ratios' median, 95% interval"
        ),
        format!(
            "{:.2} / {:.2} = {:.3}×; {:.3}×, {} ({} against {line}, deciding nothing)",
            pods as f64 / agent_s,
            pods as f64 / direct,
            direct / agent_s,
            context.median,
            context.interval_text(),
            context.verdict.word()
        ),
    )
}

/// The figure for BPF statistics that were on before the benchmark.
pub fn stats_were_on() -> Figure {
    Figure::new(
        "the kernel's BPF statistics",
        "already on before the benchmark (kernel.bpf_stats_enabled = 1): left on".into(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::sequential::Rule;

    fn round(agent_ns: u64, programs_ns: Option<u64>) -> Batch {
        Batch {
            cost: RoundCost {
                pods: 8,
                runtime_ns: 1_600_000_000,
                pods_ns: 400_000_000,
                agent_ns,
                programs_ns,
            },
            to_running_s: vec![0.3; 8],
            window_s: 4.0,
            agent_idle_ns: Some(20_000_000),
        }
    }

    #[test]
    fn a_missed_share_names_the_part_that_costs_most() {
        // 2,000 ms of node CPU (less 4 ms of programs) for 8 pods; the agent 50 ms.
        let costs: Vec<Batch> = (0..8).map(|_| round(50_000_000, Some(4_000_000))).collect();
        let shares: Vec<f64> = costs.iter().map(|b| b.cost.share()).collect();
        let rule = Rule::at_most(2.0, 8, 8, 16);
        let decision = rule.decide(&shares);
        assert_eq!(decision.verdict, Verdict::Missed);
        let text = verdict(&decision, &costs, None);
        assert!(text.starts_with("missed: median share 2.71%"), "{text}");
        assert!(
            text.contains(
                "the agent's process 2.51% (1.00% of it what it spends with no pods over as \
                 long) and its programs 0.20% (the larger part: the agent's own work)"
            ),
            "{text}"
        );
        let figures = figures("concurrency 8", &decision, &costs, None);
        assert_eq!(
            figures[1].value, "249.5 ms (200.0 + 50.0) / 6.25 ms / 0.500 ms",
            "node per pod less the programs, then the parts"
        );
    }

    #[test]
    fn the_context_is_pooled_pods_per_second_and_the_rounds_ratios() {
        // Two batches of 8 pods whose slowest took 0.3 s; the direct driver's 0.24 s.
        let batches = vec![round(0, None), round(0, None)];
        let context = Rule::new(0.95, 8, 8, 16).decide(&[0.8, 0.8]);
        let f = context_figure("concurrency 8: ", &batches, &[0.24, 0.24], &context, 0.95);
        assert!(
            f.name.starts_with("concurrency 8: context: pods/s"),
            "{}",
            f.name
        );
        assert!(
            f.value.starts_with("26.67 / 33.33 = 0.800×; 0.800×, "),
            "{}",
            f.value
        );
        assert!(
            f.value
                .ends_with("(undecided against 0.95, deciding nothing)"),
            "{}",
            f.value
        );
    }

    #[test]
    fn a_met_share_is_the_decision_alone_and_unmeasured_programs_say_why() {
        let mut costs: Vec<Batch> = (0..8).map(|_| round(10_000_000, None)).collect();
        costs[3].agent_idle_ns = None;
        let shares: Vec<f64> = costs.iter().map(|b| b.cost.share()).collect();
        let decision = Rule::at_most(2.0, 8, 8, 16).decide(&shares);
        assert_eq!(decision.verdict, Verdict::Met);
        let text = verdict(&decision, &costs, Some("BPF_ENABLE_STATS refused"));
        assert!(text.starts_with("met: median share 0.50%"), "{text}");
        assert!(
            text.ends_with(
                "(the agent's process only: its programs not measured: BPF_ENABLE_STATS refused)"
            ),
            "{text}"
        );
        let figures = figures("250 pods", &decision, &costs, Some("refused"));
        assert!(
            figures[1].value.ends_with("not measured: refused"),
            "{}",
            figures[1].value
        );
    }
}
