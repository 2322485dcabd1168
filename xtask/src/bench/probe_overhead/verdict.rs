//! Benchmark 4's verdict on one kernel's run: what the kernel accounts decides (no lost
//! events, and the worst program's run time per hit, not judged on an emulated CPU); the
//! workload's wall-clock ratios in the agent's configuration and with every program
//! attached are context, each with its interval, and decide nothing. The lines on pods
//! (the programs' share of the node's CPU per pod) are judged in [`super::pod_share`].

use super::super::sequential::Verdict;
use super::{GOAL_LOST, GOAL_NS_PER_HIT, Measured, worst_per_hit};

/// One kernel's verdict on its lines, and the context after them: met only if every line
/// is, missed if any is.
pub(super) fn judged(m: &Measured) -> (Verdict, String) {
    let (agent, all_on) = (&m.agent.decision, &m.all_on.decision);
    let tracepoints_alone = m
        .split
        .as_ref()
        .and_then(|s| s.kernel.as_ref())
        .map(|a| a.decision.median);
    let loss = &m.counted.summary;
    let (lost, events) = (loss.lost, loss.events);
    let lost_missed = lost > GOAL_LOST;
    let lost_part = if lost_missed {
        format!(
            "{lost} events lost ({:.3}% of {})",
            lost as f64 * 100.0 / (events + lost) as f64,
            events + lost
        )
    } else {
        format!("{lost} of {} events lost", events + lost)
    };
    let (per_hit_met, per_hit_part) = match worst_per_hit(&loss.programs) {
        None => (false, "no program run time was counted".to_string()),
        // An emulated CPU runs the programs' JIT code tens of times slower than a real
        // one: its nanoseconds say nothing about the goal.
        Some((name, ns)) if m.emulated => (
            true,
            format!("worst {ns:.0} ns per hit ({name}) on an emulated CPU, not judged"),
        ),
        Some((name, ns)) if ns > GOAL_NS_PER_HIT => (
            false,
            format!(
                "{name} at {ns:.0} ns per hit is {:.0} ns over {GOAL_NS_PER_HIT:.0} ns",
                ns - GOAL_NS_PER_HIT
            ),
        ),
        Some((name, ns)) => (true, format!("worst {ns:.0} ns per hit ({name})")),
    };
    let judged = |met: bool| if met { Verdict::Met } else { Verdict::Missed };
    let overall = Verdict::all([judged(!lost_missed), judged(per_hit_met)]);
    let alone = tracepoints_alone
        .map(|r| format!(", its syscall tracepoints alone with no program {r:.3}×"))
        .unwrap_or_default();
    let text = format!(
        "{}: {lost_part}; {per_hit_part}; context, deciding nothing: the exec workload's \
         rate in the agent's configuration {:.3}× of untraced (95% interval {}), with \
         every program attached {:.3}× (95% interval {}){alone}",
        overall.word(),
        agent.median,
        agent.interval_text(),
        all_on.median,
        all_on.interval_text(),
    );
    (overall, text)
}

#[cfg(test)]
mod tests {
    use super::super::super::sequential::{Decision, Rule};
    use super::super::report::tests::{measured, summary};
    use super::super::{GOAL_ALL_RATIO, GOAL_RATIO};
    use super::*;
    use crate::bench::assert_has;

    /// A decision on 16 rounds of `ratios` repeated, judged against `line` at one look.
    fn decided(line: f64, ratios: &[f64]) -> Decision {
        let rule = Rule::new(line, 16, 16, 16);
        let all: Vec<f64> = ratios.iter().copied().cycle().take(16).collect();
        rule.decide(&all)
    }

    #[test]
    fn the_kernels_lines_decide_and_the_ratios_are_context() {
        // The agent's ratio 0.995, every program's 0.985, the tracepoints alone 0.99.
        let mut m = measured("6.18.44", 0.985, Some(0.99));
        m.counted.summary = summary(5000, 0, &[("sched_process_exec", 420_000, 1000)]);
        let met = judged(&m).1;
        assert!(
            met.starts_with(
                "met: 0 of 5000 events lost; worst 420 ns per hit (sched_process_exec); \
                 context, deciding nothing: the exec workload's rate in the agent's \
                 configuration 0.995× of untraced (95% interval 0.995–0.995)"
            ),
            "{met}"
        );
        assert_has(
            &met,
            &[
                "with every program attached 0.985× (95% interval 0.985–0.985)",
                "its syscall tracepoints alone with no program 0.990×",
            ],
        );
        // A ratio below its old line, or straddling it, changes nothing.
        m.agent.decision = decided(GOAL_RATIO, &[0.95]);
        m.all_on.decision = decided(GOAL_ALL_RATIO, &[0.97, 1.01]);
        assert!(judged(&m).1.starts_with("met: "), "{}", judged(&m).1);
        assert_eq!(judged(&m).0, Verdict::Met);
    }

    #[test]
    fn each_missed_line_is_named_with_by_how_much() {
        let mut m = measured("6.18.44", 0.93, Some(0.97));
        m.counted.summary = summary(990, 10, &[("sys_enter_execve", 1_250_000, 1000)]);
        let (verdict, missed) = judged(&m);
        assert_eq!(verdict, Verdict::Missed);
        assert!(
            missed.starts_with(
                "missed: 10 events lost (1.000% of 1000); sys_enter_execve at 1250 ns per \
                 hit is 750 ns over 500 ns"
            ),
            "{missed}"
        );
    }

    #[test]
    fn at_the_line_is_met_and_nothing_counted_is_missed_and_emulation_not_judged() {
        let mut m = measured("6.18.44", GOAL_ALL_RATIO, None);
        let at_goal = (GOAL_NS_PER_HIT * 1000.0) as u64;
        m.counted.summary = summary(1, 0, &[("x", at_goal, 1000)]);
        assert!(judged(&m).1.starts_with("met"), "{}", judged(&m).1);
        m.counted.summary = summary(1, 0, &[]);
        let unknown = judged(&m).1;
        assert!(
            unknown.starts_with("missed: 0 of 1 events lost; no program run time was counted"),
            "{unknown}"
        );
        m.counted.summary = summary(1, 0, &[("x", 23_000_000, 1000)]);
        m.emulated = true;
        assert_has(
            &judged(&m).1,
            &["worst 23000 ns per hit (x) on an emulated CPU, not judged"],
        );
        assert_eq!(judged(&m).0, Verdict::Met);
    }
}
