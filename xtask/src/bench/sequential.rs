//! How many rounds a benchmark runs, and what it concludes: rounds in batches until the
//! interval of the median round value lies on one side of the goal's line, up to a cap,
//! and "undecided" when it still holds the line at the cap. A round's value is a ratio of
//! two arms (time to Running alone over observed, say), judged at least a line, or a cost
//! as a share in percent (the CPU podlapse adds over the node's), judged at most a line.
//!
//! The interval is the distribution-free one of [`median_interval`] (order statistics of
//! the round ratios), as the benchmarks used before: a round's ratio compares two arms
//! run next to each other, the rounds' ratios are as independent as the machine lets
//! them be, and their distribution is anything but normal (a round caught by a burst of
//! other work lands far out), so an interval that assumes nothing about it is the one to
//! trust. A bootstrap would assume less than a t interval but still undercovers with the
//! few rounds some benchmarks afford.
//!
//! Looking at the interval after every round and stopping once it is clear of the line
//! would be wrong more often than 5%: each look is another chance for noise to push it
//! clear. So the rule looks only after batches of rounds (at `min_rounds`, every `batch`
//! rounds after that, and at `cap`), and splits the 5% among those looks (Bonferroni):
//! each look's interval misses the median with probability at most 5% / looks, so every
//! interval the run could stop on covers it at once with probability at least 95%, and a
//! met or missed verdict is wrong with probability at most 5%, whenever the run stops.
//! Fewer looks keep each look's interval narrower; that is why the batches are large.

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::stats::{median, median_interval};

/// The chance, over a whole run whatever look it stops at, that the interval it reports
/// misses the median of the round ratios.
const MISS: f64 = 0.05;

/// Which side of its line a goal wants the median on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Bound {
    /// A ratio of two arms, at least the line.
    AtLeast,
    /// A share in percent, at most the line.
    AtMost,
}

/// When a benchmark stops running rounds: see the module's documentation.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Rule {
    /// The goal's line: the median round value must be on [`Rule::bound`]'s side of it.
    pub line: f64,
    pub bound: Bound,
    /// The first look, after this many rounds; no verdict before it.
    pub min_rounds: usize,
    /// Rounds between looks.
    pub batch: usize,
    /// The most rounds; the last look.
    pub cap: usize,
}

/// Which side of the line the interval put the median on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Verdict {
    /// The whole interval at or above the line.
    Met,
    /// The whole interval below the line.
    Missed,
    /// The line inside the interval at the cap, or no interval yet.
    Undecided,
}

impl Verdict {
    pub fn word(self) -> &'static str {
        match self {
            Verdict::Met => "met",
            Verdict::Missed => "missed",
            Verdict::Undecided => "undecided",
        }
    }

    /// Several goals together: missed if any is, else undecided if any is, else met.
    pub fn all(verdicts: impl IntoIterator<Item = Verdict>) -> Verdict {
        verdicts
            .into_iter()
            .fold(Verdict::Met, |all, v| match (all, v) {
                (Verdict::Missed, _) | (_, Verdict::Missed) => Verdict::Missed,
                (Verdict::Undecided, _) | (_, Verdict::Undecided) => Verdict::Undecided,
                _ => Verdict::Met,
            })
    }
}

/// What a run of rounds concluded.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Decision {
    pub verdict: Verdict,
    /// The median of the round ratios.
    pub median: f64,
    /// The interval of the last look; `None` when the rounds were too few for one.
    pub interval: Option<(f64, f64)>,
    /// The rounds it used.
    pub rounds: usize,
    pub rule: Rule,
}

impl Rule {
    /// A rule for a ratio that must be at least `line`; panics on a schedule with no look
    /// (a constant's mistake).
    pub const fn new(line: f64, min_rounds: usize, batch: usize, cap: usize) -> Rule {
        assert!(min_rounds >= 1 && batch >= 1 && cap >= min_rounds);
        Rule {
            line,
            bound: Bound::AtLeast,
            min_rounds,
            batch,
            cap,
        }
    }

    /// A rule for a share in percent that must be at most `line`.
    pub const fn at_most(line: f64, min_rounds: usize, batch: usize, cap: usize) -> Rule {
        let rule = Rule::new(line, min_rounds, batch, cap);
        Rule {
            bound: Bound::AtMost,
            ..rule
        }
    }

    /// A round value as the rule's reports show it: a ratio to three places, a share in
    /// percent to two.
    pub fn show(&self, value: f64) -> String {
        match self.bound {
            Bound::AtLeast => format!("{value:.3}"),
            Bound::AtMost => format!("{value:.2}%"),
        }
    }

    /// The line as the reports show it: as given for a ratio, in percent for a share.
    fn show_line(&self) -> String {
        match self.bound {
            Bound::AtLeast => self.line.to_string(),
            Bound::AtMost => format!("{}%", self.line),
        }
    }

    /// What a round's value is, in words.
    fn noun(&self) -> &'static str {
        match self.bound {
            Bound::AtLeast => "ratio",
            Bound::AtMost => "share",
        }
    }

    /// The rule with at most `cap` rounds (a shorter run asked for on the command line):
    /// its first look moves down to the cap when it was past it.
    pub fn capped(self, cap: Option<usize>) -> Rule {
        let Some(cap) = cap.map(|c| c.max(1)) else {
            return self;
        };
        let cap = cap.min(self.cap);
        Rule {
            min_rounds: self.min_rounds.min(cap),
            cap,
            ..self
        }
    }

    /// How many looks a run can take: at `min_rounds`, every `batch` after, and at `cap`.
    pub fn looks(&self) -> usize {
        1 + (self.cap - self.min_rounds).div_ceil(self.batch)
    }

    /// Each look's chance of missing the median: the run's 5% split among its looks.
    pub fn miss_per_look(&self) -> f64 {
        MISS / self.looks() as f64
    }

    /// After `ratios` (one per round so far): how many more rounds to run before the next
    /// look, or `None` to stop (decided at a look, or at the cap).
    pub fn next(&self, ratios: &[f64]) -> Option<usize> {
        let n = ratios.len();
        if n >= self.cap {
            return None;
        }
        if n < self.min_rounds {
            return Some(self.min_rounds - n);
        }
        let past = n - self.min_rounds;
        if past.is_multiple_of(self.batch) && self.decide(ratios).verdict != Verdict::Undecided {
            return None;
        }
        let next_look = (self.min_rounds + (past / self.batch + 1) * self.batch).min(self.cap);
        Some(next_look - n)
    }

    /// The verdict on `ratios` as they are: met or missed only from `min_rounds` on and
    /// with the interval clear of the line.
    pub fn decide(&self, ratios: &[f64]) -> Decision {
        let interval = median_interval(ratios, self.miss_per_look());
        let verdict = match (self.bound, interval) {
            _ if ratios.len() < self.min_rounds => Verdict::Undecided,
            (Bound::AtLeast, Some((lo, _))) if lo >= self.line => Verdict::Met,
            (Bound::AtLeast, Some((_, hi))) if hi < self.line => Verdict::Missed,
            (Bound::AtMost, Some((_, hi))) if hi <= self.line => Verdict::Met,
            (Bound::AtMost, Some((lo, _))) if lo > self.line => Verdict::Missed,
            _ => Verdict::Undecided,
        };
        Decision {
            verdict,
            median: median(ratios),
            interval,
            rounds: ratios.len(),
            rule: *self,
        }
    }

    /// Runs rounds as [`Rule::next`] says, `round(i)` giving round `i`'s ratio (from 0),
    /// and decides on them.
    pub fn run<E>(&self, mut round: impl FnMut(usize) -> Result<f64, E>) -> Result<Decision, E> {
        let mut ratios = Vec::new();
        while let Some(more) = self.next(&ratios) {
            for _ in 0..more {
                ratios.push(round(ratios.len())?);
            }
        }
        Ok(self.decide(&ratios))
    }

    /// The rule in words, for a benchmark's method.
    pub fn describe(&self) -> String {
        match self.bound {
            Bound::AtLeast => explain(self.line, &self.schedule()),
            Bound::AtMost => explain_share(self.line, &self.schedule()),
        }
    }

    /// When it looks: "after 16 rounds, then every 16 more up to 48 (3 looks, each a
    /// 98.3% interval)".
    pub fn schedule(&self) -> String {
        format!(
            "after {} rounds, then every {} more up to {} ({} looks, each a {:.1}% interval)",
            self.min_rounds,
            self.batch,
            self.cap,
            self.looks(),
            100.0 * (1.0 - self.miss_per_look()),
        )
    }
}

/// How rules judge a ratio against `line`, for a benchmark's method, with when they look
/// (one [`Rule::schedule`], or several named).
pub fn explain(line: f64, schedule: &str) -> String {
    format!(
        "Rounds run in batches, and at each look ({schedule}) the median of the round \
         ratios is judged by its distribution-free interval (order statistics of the \
         ratios): met once the whole interval is at or above {line}, missed once it is \
         below, undecided if it still holds {line} at the cap. The 95% is split among the \
         looks, so the interval a run stops on covers the median with at least 95% \
         whatever look that is."
    )
}

/// [`explain`] for rules on shares, judged at most `line` percent.
pub fn explain_share(line: f64, schedule: &str) -> String {
    format!(
        "Rounds run in batches, and at each look ({schedule}) the median of the round \
         shares is judged by its distribution-free interval (order statistics of the \
         shares): met once the whole interval is at or below {line}%, missed once it is \
         above, undecided if it still holds {line}% at the cap. The 95% is split among the \
         looks, so the interval a run stops on covers the median with at least 95% \
         whatever look that is."
    )
}

impl Decision {
    /// "met: median ratio 0.997, 95% interval 0.991–1.004 over 48 rounds (...)".
    pub fn text(&self) -> String {
        format!("{}: {}", self.verdict.word(), self.details())
    }

    /// The interval as `lo–hi`, or a dash when there is none.
    pub fn interval_text(&self) -> String {
        self.interval.map_or("-".to_string(), |(lo, hi)| {
            format!("{}–{}", self.rule.show(lo), self.rule.show(hi))
        })
    }

    /// [`Decision::text`] without the verdict's word.
    pub fn details(&self) -> String {
        let r = &self.rule;
        let interval = match self.interval {
            Some(_) => format!("95% interval {}", self.interval_text()),
            None => "no 95% interval".to_string(),
        };
        let how = match self.verdict {
            Verdict::Met | Verdict::Missed => {
                format!("decided after {} of at most {}", self.rounds, r.cap)
            }
            Verdict::Undecided if self.rounds < r.min_rounds => {
                format!("fewer than the {} it takes to decide", r.min_rounds)
            }
            Verdict::Undecided => {
                format!("{} still inside it at the cap of {}", r.show_line(), r.cap)
            }
        };
        format!(
            "median {} {}, {interval} over {} rounds (rounds in batches of {} until the \
             interval clears {}: {how})",
            r.noun(),
            r.show(self.median),
            self.rounds,
            r.batch,
            r.show_line()
        )
    }

    /// The decision and its rule, for samples.json.
    pub fn to_json(&self) -> Value {
        let r = &self.rule;
        json!({
            "verdict": self.verdict.word(),
            "bound": self.rule.bound,
            "median_ratio": self.median,
            "interval": self.interval.map(|(lo, hi)| [lo, hi]),
            "rounds": self.rounds,
            "rule": {
                "line": r.line,
                "min_rounds": r.min_rounds,
                "batch": r.batch,
                "cap": r.cap,
                "looks": r.looks(),
                "miss_per_look": r.miss_per_look(),
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::assert_has;

    /// `n` ratios spread evenly over `centre ± spread`, shuffled so that no run of them
    /// drifts one way (a deterministic stand-in for noisy rounds).
    fn noisy(centre: f64, spread: f64, n: usize) -> Vec<f64> {
        (0..n)
            .map(|i| {
                // 37 is coprime with every n used here: a permutation of 0..n.
                let j = (i * 37 + 11) % n;
                centre - spread + 2.0 * spread * j as f64 / (n - 1).max(1) as f64
            })
            .collect()
    }

    /// Runs `rule` over `pool`, round `i` taking `pool[i]`.
    fn run(rule: &Rule, pool: &[f64]) -> Decision {
        rule.run(|i| Ok::<f64, ()>(pool[i])).unwrap()
    }

    const RULE: Rule = Rule::new(0.99, 16, 8, 48);

    #[test]
    fn a_capped_rule_stops_at_the_cap_and_never_runs_longer_than_its_own() {
        let rule = Rule::new(0.99, 32, 32, 160);
        assert_eq!(rule.capped(None), rule);
        let short = rule.capped(Some(16));
        assert_eq!((short.min_rounds, short.cap, short.batch), (16, 16, 32));
        assert_eq!(short.looks(), 1);
        assert_eq!(rule.capped(Some(64)).cap, 64);
        assert_eq!(rule.capped(Some(64)).min_rounds, 32);
        // A cap above the rule's own changes nothing; a cap of 0 still runs one round.
        assert_eq!(rule.capped(Some(500)), rule);
        assert_eq!(rule.capped(Some(0)).cap, 1);
    }

    #[test]
    fn looks_come_at_the_minimum_every_batch_after_and_at_the_cap() {
        let rule = Rule::new(0.99, 8, 8, 20);
        assert_eq!(rule.looks(), 3);
        assert!((rule.miss_per_look() - 0.05 / 3.0).abs() < 1e-12);
        // A run that never decides stops at 8, 16 and 20, then ends.
        let straddling = [0.98, 1.0];
        let mut ratios = Vec::new();
        let mut stops = Vec::new();
        while let Some(more) = rule.next(&ratios) {
            for _ in 0..more {
                ratios.push(straddling[ratios.len() % 2]);
            }
            stops.push(ratios.len());
        }
        assert_eq!(stops, [8, 16, 20]);
        assert_eq!(RULE.looks(), 5);
        // Between looks (a run resumed mid-batch), it runs on to the next look.
        assert_eq!(rule.next(&[1.0; 10]), Some(6));
        assert_eq!(rule.next(&[1.0; 25]), None);
    }

    #[test]
    fn clearly_above_the_line_stops_at_the_first_look_as_met() {
        let d = run(&RULE, &noisy(1.05, 0.03, 48));
        assert_eq!(d.verdict, Verdict::Met);
        assert_eq!(d.rounds, 16);
        let (lo, hi) = d.interval.unwrap();
        assert!(lo >= 0.99 && lo <= d.median && d.median <= hi, "{d:?}");
        assert!(
            d.text().starts_with("met: median ratio 1.0"),
            "{}",
            d.text()
        );
        assert!(
            d.text().ends_with(
                "over 16 rounds (rounds in batches of 8 until the interval clears 0.99: \
                 decided after 16 of at most 48)"
            ),
            "{}",
            d.text()
        );
    }

    #[test]
    fn clearly_below_the_line_stops_at_the_first_look_as_missed() {
        let d = run(&RULE, &noisy(0.93, 0.03, 48));
        assert_eq!(d.verdict, Verdict::Missed);
        assert_eq!(d.rounds, 16);
        assert!(d.interval.unwrap().1 < 0.99, "{d:?}");
        assert!(
            d.text().starts_with("missed: median ratio 0.9"),
            "{}",
            d.text()
        );
    }

    #[test]
    fn close_to_the_line_takes_more_looks_before_it_decides() {
        // 1.0 ± 0.02: the intervals at 16, 24 and 32 rounds hold 0.99, the one at 40 is
        // clear of it.
        let d = run(&RULE, &noisy(1.0, 0.02, 48));
        assert_eq!((d.verdict, d.rounds), (Verdict::Met, 40), "{d:?}");
        assert!(d.interval.unwrap().0 >= 0.99, "{d:?}");
        assert_eq!(
            RULE.decide(&noisy(1.0, 0.02, 48)[..32]).verdict,
            Verdict::Undecided
        );
    }

    #[test]
    fn straddling_the_line_runs_to_the_cap_and_says_undecided_with_the_interval() {
        let d = run(&RULE, &noisy(0.99, 0.05, 48));
        assert_eq!(d.verdict, Verdict::Undecided);
        assert_eq!(d.rounds, 48);
        let (lo, hi) = d.interval.unwrap();
        assert!(lo < 0.99 && 0.99 <= hi, "{d:?}");
        let text = d.text();
        assert!(
            text.starts_with("undecided: median ratio 0.990, 95% interval "),
            "{text}"
        );
        assert_has(&text, &[&format!("{lo:.3}–{hi:.3} over 48 rounds")]);
        assert!(
            text.ends_with("0.99 still inside it at the cap of 48)"),
            "{text}"
        );
        assert!(!text.contains("met") && !text.contains("missed"), "{text}");
    }

    #[test]
    fn fewer_rounds_than_the_minimum_never_decide() {
        let far_above = vec![2.0; 48];
        for n in 0..16 {
            assert_eq!(RULE.next(&far_above[..n]), Some(16 - n));
            let d = RULE.decide(&far_above[..n]);
            assert_eq!(d.verdict, Verdict::Undecided, "{n}: {d:?}");
        }
        assert_has(
            &RULE.decide(&far_above[..12]).text(),
            &["fewer than the 16 it takes to decide"],
        );
        assert_eq!(RULE.decide(&far_above[..16]).verdict, Verdict::Met);
        // A minimum too small for any interval at its look's share cannot decide there.
        let tiny = Rule::new(0.99, 2, 2, 4);
        let d = run(&tiny, &[2.0; 4]);
        assert_eq!(
            (d.verdict, d.rounds, d.interval),
            (Verdict::Undecided, 4, None)
        );
        assert_has(&d.text(), &["no 95% interval over 4 rounds"]);
    }

    #[test]
    fn a_share_is_met_below_its_line_missed_above_and_shown_in_percent() {
        let rule = Rule::at_most(2.0, 8, 8, 24);
        let below = run(&rule, &noisy(0.6, 0.2, 24));
        assert_eq!((below.verdict, below.rounds), (Verdict::Met, 8));
        assert!(
            below.text().starts_with("met: median share 0.5") && below.text().contains("%"),
            "{}",
            below.text()
        );
        let above = run(&rule, &noisy(3.0, 0.3, 24));
        assert_eq!(above.verdict, Verdict::Missed);
        let straddling = run(&rule, &noisy(2.0, 0.5, 24));
        assert_eq!(
            (straddling.verdict, straddling.rounds),
            (Verdict::Undecided, 24)
        );
        assert!(
            straddling
                .text()
                .contains("2% still inside it at the cap of 24"),
            "{}",
            straddling.text()
        );
        // At the line is met, as for ratios; the rule in words says which side it wants.
        assert_eq!(rule.decide(&[2.0; 8]).verdict, Verdict::Met);
        assert_has(
            &rule.describe(),
            &["at or below 2%", "missed once it is above"],
        );
    }

    #[test]
    fn at_the_line_is_met() {
        let d = run(&RULE, &[0.99; 48]);
        assert_eq!((d.verdict, d.rounds), (Verdict::Met, 16));
    }

    #[test]
    fn the_rule_in_words_names_its_looks_and_their_share() {
        let d = RULE.describe();
        assert_has(
            &d,
            &[
                "(after 16 rounds, then every 8 more up to 48 (5 looks, each a 99.0% interval))",
                "at or above 0.99, missed once it is below",
            ],
        );
    }

    #[test]
    fn several_goals_are_missed_if_any_is_then_undecided_if_any_is() {
        use Verdict::*;
        assert_eq!(Verdict::all([Met, Met]), Met);
        assert_eq!(Verdict::all([Met, Undecided]), Undecided);
        assert_eq!(Verdict::all([Undecided, Missed, Met]), Missed);
        assert_eq!(Verdict::all([]), Met);
    }

    #[test]
    fn the_samples_keep_the_rule_and_the_interval() {
        let d = run(&RULE, &noisy(1.05, 0.03, 48));
        let j = d.to_json();
        assert_eq!(j["verdict"], "met");
        assert_eq!(j["rounds"], 16);
        assert_eq!(j["rule"]["cap"], 48);
        assert_eq!(j["rule"]["looks"], 5);
        assert!(j["interval"][0].as_f64().unwrap() >= 0.99);
    }
}
