//! Benchmark 4's verdict on its four goals: the workload's ratio in the agent's
//! configuration and with every program attached (each by its rule's decision: met,
//! missed or undecided, with its interval and rounds), no lost events, and the worst
//! program's run time per hit.

use super::super::sequential::{Decision, Verdict};
use super::{GOAL_LOST, GOAL_NS_PER_HIT};

/// Every goal's result, and by how much a missed one missed, after the verdict it starts
/// with: missed if any goal is, else undecided if a ratio is, else met. On an `emulated`
/// CPU the run time per hit is shown but not judged.
pub(super) fn judged(
    agent: &Decision,
    all_on: &Decision,
    tracepoints_alone: Option<f64>,
    lost: u64,
    events: u64,
    worst: Option<(&str, f64)>,
    emulated: bool,
) -> (Verdict, String) {
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
    let (per_hit_met, per_hit_part) = match worst {
        None => (false, "no program run time was counted".to_string()),
        // An emulated CPU runs the programs' JIT code tens of times slower than a real
        // one: its nanoseconds say nothing about the goal, which the ratios still judge.
        Some((name, ns)) if emulated => (
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
    use super::super::super::sequential::Rule;
    use super::super::{GOAL_ALL_RATIO, GOAL_RATIO};
    use super::*;

    /// A decision on 16 rounds of `ratios` repeated, judged against `line` at one look.
    fn decided(line: f64, ratios: &[f64]) -> Decision {
        let rule = Rule::new(line, 16, 16, 16);
        let all: Vec<f64> = ratios.iter().copied().cycle().take(16).collect();
        rule.decide(&all)
    }

    #[test]
    fn all_goals_met_is_met_with_every_figure() {
        let met = judged(
            &decided(GOAL_RATIO, &[0.995]),
            &decided(GOAL_ALL_RATIO, &[0.985]),
            Some(0.99),
            0,
            5000,
            Some(("sched_process_exec", 420.0)),
            false,
        )
        .1;
        assert!(
            met.starts_with(
                "met: the workload in the agent's configuration, met: median ratio 0.995, 95% \
                 interval 0.995–0.995 over 16 rounds"
            ),
            "{met}"
        );
        assert!(
            met.contains("; with every program attached, met: median ratio 0.985"),
            "{met}"
        );
        assert!(
            met.ends_with("; 0 of 5000 events lost; worst 420 ns per hit (sched_process_exec)"),
            "{met}"
        );
        assert!(!met.contains("tracepoints alone"), "{met}");
    }

    #[test]
    fn each_missed_goal_is_named_with_by_how_much() {
        let missed = judged(
            &decided(GOAL_RATIO, &[0.95]),
            &decided(GOAL_ALL_RATIO, &[0.93]),
            Some(0.97),
            10,
            990,
            Some(("sys_enter_execve", 1250.0)),
            false,
        )
        .1;
        assert!(
            missed.starts_with(
                "missed: the workload in the agent's configuration, missed: median ratio 0.950"
            ),
            "{missed}"
        );
        assert!(
            missed.contains(
                "with every program attached, missed: median ratio 0.930, 95% interval \
                 0.930–0.930"
            ),
            "{missed}"
        );
        assert!(
            missed.contains("; its syscall tracepoints alone, with no program: 0.970×"),
            "{missed}"
        );
        assert!(
            missed.contains("10 events lost (1.000% of 1000)"),
            "{missed}"
        );
        assert!(
            missed.contains("sys_enter_execve at 1250 ns per hit is 750 ns over 500 ns"),
            "{missed}"
        );
    }

    #[test]
    fn a_ratio_still_straddling_its_line_is_undecided_never_met_or_missed() {
        let undecided = judged(
            &decided(GOAL_RATIO, &[0.97, 1.01]),
            &decided(GOAL_ALL_RATIO, &[0.99]),
            None,
            0,
            100,
            Some(("x", 10.0)),
            false,
        )
        .1;
        assert!(
            undecided.starts_with(
                "undecided: the workload in the agent's configuration, undecided: median \
                 ratio 0.990, 95% interval 0.970–1.010 over 16 rounds"
            ),
            "{undecided}"
        );
        assert!(
            undecided.contains("0.99 still inside it at the cap of 16"),
            "{undecided}"
        );
        // Another goal missed makes the whole missed; the ratio stays undecided.
        let lost = judged(
            &decided(GOAL_RATIO, &[0.97, 1.01]),
            &decided(GOAL_ALL_RATIO, &[0.99]),
            None,
            1,
            99,
            Some(("x", 10.0)),
            false,
        )
        .1;
        assert!(
            lost.starts_with(
                "missed: the workload in the agent's configuration, undecided: median ratio"
            ),
            "{lost}"
        );
        assert!(lost.contains("1 events lost (1.000% of 100)"), "{lost}");
    }

    #[test]
    fn at_the_goals_is_met_and_nothing_counted_or_no_rounds_is_not() {
        let exactly = judged(
            &decided(GOAL_RATIO, &[GOAL_RATIO]),
            &decided(GOAL_ALL_RATIO, &[GOAL_ALL_RATIO]),
            None,
            0,
            1,
            Some(("x", GOAL_NS_PER_HIT)),
            false,
        )
        .1;
        assert!(exactly.starts_with("met"), "{exactly}");
        let unknown = judged(
            &decided(GOAL_RATIO, &[1.0]),
            &decided(GOAL_ALL_RATIO, &[1.0]),
            None,
            0,
            1,
            None,
            false,
        )
        .1;
        assert!(unknown.starts_with("missed: "), "{unknown}");
        assert!(
            unknown.ends_with("; no program run time was counted"),
            "{unknown}"
        );
        let no_rounds = Rule::new(GOAL_ALL_RATIO, 16, 16, 48).decide(&[]);
        let none = judged(
            &decided(GOAL_RATIO, &[1.0]),
            &no_rounds,
            None,
            0,
            1,
            Some(("x", 10.0)),
            false,
        )
        .1;
        assert!(none.starts_with("undecided: "), "{none}");
        assert!(
            none.contains("with every program attached, undecided: median ratio NaN"),
            "{none}"
        );
    }
}
