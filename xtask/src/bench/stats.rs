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

/// A distribution-free 95% confidence interval for the median of a benchmark's rounds:
/// the `k`th lowest and `k`th highest, with `k` the largest for which fewer than `k` of
/// `n` fair coin flips come up heads with probability at most 2.5%. `None` below six
/// values, where no such `k` exists.
pub fn median_ci(values: &[f64]) -> Option<(f64, f64)> {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    // P(X <= j) for X ~ Binomial(n, 1/2), summed term by term.
    let mut term = 0.5f64.powi(n as i32);
    let mut below = 0.0;
    let mut k = 0;
    for j in 0..n {
        below += term;
        if below > 0.025 {
            break;
        }
        k = j + 1;
        term *= (n - j) as f64 / (j + 1) as f64;
    }
    (k >= 1).then(|| (v[k - 1], v[n - k]))
}

/// `lo–hi` of [`median_ci`], or a dash.
pub fn ci_text(values: &[f64]) -> String {
    median_ci(values).map_or("-".to_string(), |(lo, hi)| format!("{lo:.3}–{hi:.3}"))
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
            median_ci(&v).map(|(lo, hi)| (lo as usize, hi as usize))
        };
        assert_eq!(ranks(6), Some((1, 6)));
        assert_eq!(ranks(9), Some((2, 8)));
        assert_eq!(ranks(32), Some((10, 23)));
        assert_eq!(ranks(5), None);
        // Order does not matter.
        assert_eq!(median_ci(&[3.0, 1.0, 2.0, 6.0, 5.0, 4.0]), Some((1.0, 6.0)));
        assert_eq!(ci_text(&[1.0]), "-");
    }

    #[test]
    fn the_median_takes_the_middle_or_the_mean_of_the_middle_two() {
        assert_eq!(median(&[0.99, 0.90, 1.01]), 0.99);
        assert_eq!(median(&[1.0, 0.9, 0.95, 0.5]), 0.925);
        assert!(median(&[]).is_nan());
    }
}
