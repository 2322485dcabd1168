//! Benchmark 4's verdict on its four goals: the workload's ratio in the agent's
//! configuration and with every program attached (each by its rule's decision: met,
//! missed or undecided, with its interval and rounds), no lost events, and the worst
//! program's run time per hit.

use super::super::sequential::Verdict;
use super::{GOAL_LOST, GOAL_NS_PER_HIT, Measured, worst_per_hit};

/// One kernel's verdict: every goal's result, and by how much a missed one missed, after
/// the verdict it starts with: missed if any goal is, else undecided if a ratio is, else
/// met. On an `emulated` CPU the run time per hit is shown but not judged.
pub(super) fn judged(m: &Measured) -> (Verdict, String) {
    let (agent, all_on) = (&m.agent.decision, &m.all_on.decision);
    let tracepoints_alone = m.split.kernel.as_ref().map(|a| a.decision.median);
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
        // one: its nanoseconds say nothing about the goal, which the ratios still judge.
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
    let overall = Verdict::all([
        agent.verdict,
        all_on.verdict,
        judged(!lost_missed),
        judged(per_hit_met),
    ]);
    // Beside a ratio with every program attached that is not met: how much of it the
    // kernel's syscall tracepoints cost with no program on them.
    let alone = match (all_on.verdict, tracepoints_alone) {
        (Verdict::Met, _) | (_, None) => String::new(),
        (_, Some(r)) => format!("; its syscall tracepoints alone, with no program: {r:.3}×"),
    };
    let text = format!(
        "{}: the workload in the agent's configuration, {}; with every program attached, \
         {}{alone}; {lost_part}; {per_hit_part}",
        overall.word(),
        agent.text(),
        all_on.text()
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
    fn all_goals_met_is_met_with_every_figure() {
        // The agent's ratio 0.995, every program's 0.985, the tracepoints alone 0.99.
        let mut m = measured("6.18.44", 0.985, Some(0.99));
        m.counted.summary = summary(5000, 0, &[("sched_process_exec", 420_000, 1000)]);
        let met = judged(&m).1;
        assert!(
            met.starts_with(
                "met: the workload in the agent's configuration, met: median ratio 0.995, 95% \
                 interval 0.995–0.995 over 16 rounds"
            ),
            "{met}"
        );
        assert_has(
            &met,
            &["; with every program attached, met: median ratio 0.985"],
        );
        assert!(
            met.ends_with("; 0 of 5000 events lost; worst 420 ns per hit (sched_process_exec)"),
            "{met}"
        );
        assert!(!met.contains("tracepoints alone"), "{met}");
    }

    #[test]
    fn each_missed_goal_is_named_with_by_how_much() {
        let mut m = measured("6.18.44", 0.93, Some(0.97));
        m.agent.decision = decided(GOAL_RATIO, &[0.95]);
        m.counted.summary = summary(990, 10, &[("sys_enter_execve", 1_250_000, 1000)]);
        let missed = judged(&m).1;
        assert!(
            missed.starts_with(
                "missed: the workload in the agent's configuration, missed: median ratio 0.950"
            ),
            "{missed}"
        );
        assert_has(
            &missed,
            &[
                "with every program attached, missed: median ratio 0.930, 95% interval \
                 0.930–0.930",
                "; its syscall tracepoints alone, with no program: 0.970×",
                "10 events lost (1.000% of 1000)",
                "sys_enter_execve at 1250 ns per hit is 750 ns over 500 ns",
            ],
        );
    }

    #[test]
    fn a_ratio_still_straddling_its_line_is_undecided_never_met_or_missed() {
        let mut m = measured("6.18.44", 0.99, None);
        m.agent.decision = decided(GOAL_RATIO, &[0.97, 1.01]);
        m.counted.summary = summary(100, 0, &[("x", 10_000, 1000)]);
        let undecided = judged(&m).1;
        assert!(
            undecided.starts_with(
                "undecided: the workload in the agent's configuration, undecided: median \
                 ratio 0.990, 95% interval 0.970–1.010 over 16 rounds"
            ),
            "{undecided}"
        );
        assert_has(&undecided, &["0.99 still inside it at the cap of 16"]);
        // Another goal missed makes the whole missed; the ratio stays undecided.
        m.counted.summary = summary(99, 1, &[("x", 10_000, 1000)]);
        let lost = judged(&m).1;
        assert!(
            lost.starts_with(
                "missed: the workload in the agent's configuration, undecided: median ratio"
            ),
            "{lost}"
        );
        assert_has(&lost, &["1 events lost (1.000% of 100)"]);
    }

    #[test]
    fn at_the_goals_is_met_and_nothing_counted_or_no_rounds_is_not() {
        let mut m = measured("6.18.44", GOAL_ALL_RATIO, None);
        m.agent.decision = decided(GOAL_RATIO, &[GOAL_RATIO]);
        let at_goal = (GOAL_NS_PER_HIT * 1000.0) as u64;
        m.counted.summary = summary(1, 0, &[("x", at_goal, 1000)]);
        let exactly = judged(&m).1;
        assert!(exactly.starts_with("met"), "{exactly}");
        m.agent.decision = decided(GOAL_RATIO, &[1.0]);
        m.all_on.decision = decided(GOAL_ALL_RATIO, &[1.0]);
        m.counted.summary = summary(1, 0, &[]);
        let unknown = judged(&m).1;
        assert!(unknown.starts_with("missed: "), "{unknown}");
        assert!(
            unknown.ends_with("; no program run time was counted"),
            "{unknown}"
        );
        m.all_on.decision = Rule::new(GOAL_ALL_RATIO, 16, 16, 48).decide(&[]);
        m.counted.summary = summary(1, 0, &[("x", 10_000, 1000)]);
        let none = judged(&m).1;
        assert!(none.starts_with("undecided: "), "{none}");
        assert_has(
            &none,
            &["with every program attached, undecided: median ratio NaN"],
        );
    }
}
