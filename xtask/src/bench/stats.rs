//! Order statistics for the benchmarks' samples.

/// Nearest-rank percentile (`p` in 0..=100) of `samples`; NaN when there are none.
pub fn percentile(samples: &[f64], p: f64) -> f64 {
    if samples.is_empty() {
        return f64::NAN;
    }
    let mut v = samples.to_vec();
    v.sort_by(f64::total_cmp);
    let rank = ((p / 100.0) * v.len() as f64).ceil().max(1.0) as usize;
    v[rank.min(v.len()) - 1]
}

/// A distribution-free interval for the median of `values` that misses it with
/// probability at most `miss` (0.05 for a 95% interval), whatever the values'
/// distribution, as long as they are independent draws from one continuous distribution:
/// the `k`th lowest and `k`th highest, with `k` the largest for which fewer than `k` of
/// `n` fair coin flips come up heads with probability at most `miss / 2` (each value lies
/// below the median with probability one half). `None` when no such `k` exists (fewer
/// than six values at 5%).
pub fn median_interval(values: &[f64], miss: f64) -> Option<(f64, f64)> {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    // P(X <= j) for X ~ Binomial(n, 1/2), summed term by term; each term in logarithms,
    // so that 0.5^n does not underflow for long runs.
    let mut ln_term = n as f64 * 0.5f64.ln();
    let mut below = 0.0;
    let mut k = 0;
    for j in 0..n {
        below += ln_term.exp();
        if below > miss / 2.0 {
            break;
        }
        k = j + 1;
        ln_term += ((n - j) as f64 / (j + 1) as f64).ln();
    }
    (k >= 1).then(|| (v[k - 1], v[n - k]))
}

/// The median; the mean of the middle two for an even count.
pub fn median(values: &[f64]) -> f64 {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n == 0 {
        return f64::NAN;
    }
    if !n.is_multiple_of(2) {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank() {
        let v: Vec<f64> = (1..=100).rev().map(f64::from).collect();
        assert_eq!(percentile(&v, 50.0), 50.0);
        assert_eq!(percentile(&v, 99.0), 99.0);
        assert_eq!(percentile(&v, 100.0), 100.0);
        assert_eq!(percentile(&v, 0.0), 1.0);
        assert_eq!(percentile(&[7.0], 99.0), 7.0);
        assert!(percentile(&[], 50.0).is_nan());
    }

    #[test]
    fn the_median_interval_takes_the_order_statistics_of_the_binomial() {
        // Known distribution-free 95% intervals: the 1st and 6th of 6 values, the 2nd and
        // 8th of 9, the 10th and 23rd of 32.
        let ranks = |n: usize| {
            let v: Vec<f64> = (1..=n).map(|i| i as f64).collect();
            median_interval(&v, 0.05).map(|(lo, hi)| (lo as usize, hi as usize))
        };
        assert_eq!(ranks(6), Some((1, 6)));
        assert_eq!(ranks(9), Some((2, 8)));
        assert_eq!(ranks(32), Some((10, 23)));
        assert_eq!(ranks(5), None);
        // Order does not matter.
        assert_eq!(
            median_interval(&[3.0, 1.0, 2.0, 6.0, 5.0, 4.0], 0.05),
            Some((1.0, 6.0))
        );
    }

    #[test]
    fn a_smaller_miss_takes_a_wider_interval() {
        let ranks = |n: usize, miss: f64| {
            let v: Vec<f64> = (1..=n).map(|i| i as f64).collect();
            median_interval(&v, miss).map(|(lo, hi)| (lo as usize, hi as usize))
        };
        // 99%: the 1st and 8th of 8 (P(X <= 0) = 1/256 <= 0.005 < P(X <= 1) = 9/256), the
        // 9th and 24th of 32 (95%: the 10th and 23rd).
        assert_eq!(ranks(8, 0.01), Some((1, 8)));
        assert_eq!(ranks(7, 0.01), None);
        assert_eq!(ranks(32, 0.01), Some((9, 24)));
        assert_eq!(ranks(32, 0.05), Some((10, 23)));
        // Thousands of values: no underflow, and the interval is the middle 2.5% or so.
        let (lo, hi) = ranks(4000, 0.05).unwrap();
        assert!((1930..=1940).contains(&lo) && lo + hi == 4001, "{lo} {hi}");
    }

    #[test]
    fn the_median_takes_the_middle_or_the_mean_of_the_middle_two() {
        assert_eq!(median(&[0.99, 0.90, 1.01]), 0.99);
        assert_eq!(median(&[1.0, 0.9, 0.95, 0.5]), 0.925);
        assert!(median(&[]).is_nan());
    }
}
