//! Statistics every experiment needs: summaries of repetitions, ratios, latency histograms.

use std::time::Duration;

use hdrhistogram::Histogram;
use serde::Serialize;

/// Median, min, max and mean of repeated measurements.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Summary {
    pub n: usize,
    pub median: f64,
    pub min: f64,
    pub max: f64,
    pub mean: f64,
}

impl Summary {
    /// Summarise `values` (NaNs are ignored). Empty input gives all zeros and n = 0.
    pub fn of(values: &[f64]) -> Self {
        let mut v: Vec<f64> = values.iter().copied().filter(|x| !x.is_nan()).collect();
        if v.is_empty() {
            return Summary::default();
        }
        v.sort_by(|a, b| a.partial_cmp(b).expect("no NaN"));
        let n = v.len();
        let median = if n % 2 == 1 { v[n / 2] } else { (v[n / 2 - 1] + v[n / 2]) / 2.0 };
        Summary { n, median, min: v[0], max: v[n - 1], mean: v.iter().sum::<f64>() / n as f64 }
    }

    /// `median [min–max]` with `digits` decimals.
    pub fn display(&self, digits: usize) -> String {
        if self.n <= 1 {
            return format!("{:.*}", digits, self.median);
        }
        format!("{:.*} [{:.*}–{:.*}]", digits, self.median, digits, self.min, digits, self.max)
    }
}

/// A 95% confidence interval of the median of `values` that assumes nothing about their
/// distribution: the order statistics `x(k)` and `x(n+1-k)` for the largest `k` with
/// P(Bin(n, 1/2) < k) ≤ 2.5%. None below 6 values (NaNs ignored), where no such `k` exists.
/// It is what says whether a median of paired ratios resolves a target, e.g. 0.99: 21 pairs
/// give the 6th and 16th of them.
pub fn median_ci95(values: &[f64]) -> Option<(f64, f64)> {
    let mut v: Vec<f64> = values.iter().copied().filter(|x| !x.is_nan()).collect();
    v.sort_by(|a, b| a.partial_cmp(b).expect("no NaN"));
    let n = v.len();
    // P(X <= j) for X ~ Bin(n, 1/2), summed in log space (2^-n underflows past n = 1074).
    let mut ln_choose = 0.0f64; // ln C(n, j)
    let mut below = 0.0f64; // P(X <= j - 1)
    let mut k = 0; // the largest k found so far with P(X < k) <= 2.5%
    for j in 0..n / 2 {
        below += (ln_choose - n as f64 * std::f64::consts::LN_2).exp();
        if below > 0.025 {
            break;
        }
        k = j + 1;
        ln_choose += ((n - j) as f64).ln() - ((j + 1) as f64).ln();
    }
    (k >= 1).then(|| (v[k - 1], v[n - k]))
}

/// The median of per-repetition ratios `a[i] / b[i]` of two configurations whose runs were
/// paired (each pair ran back to back, so both met the same machine), with the 95% interval
/// of that median when there are enough pairs ([`median_ci95`]). Pairs whose ratio is not
/// finite (a zero baseline: nothing to compare) say nothing and are left out.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Paired {
    pub ratios: Vec<f64>,
}

impl Paired {
    pub fn of<T>(a: &[T], b: &[T], value: impl Fn(&T) -> f64) -> Self {
        let ratios = a.iter().zip(b).map(|(x, y)| ratio(value(x), value(y))).filter(|r| r.is_finite()).collect();
        Paired { ratios }
    }

    /// NaN without a single pair.
    pub fn median(&self) -> f64 {
        if self.ratios.is_empty() {
            f64::NAN
        } else {
            Summary::of(&self.ratios).median
        }
    }

    /// `median [low–high] (n=N)`, or `median (n=N)` with too few pairs for an interval.
    pub fn display(&self, digits: usize) -> String {
        match median_ci95(&self.ratios) {
            Some((lo, hi)) => {
                format!("{:.*} [{:.*}–{:.*}] (n={})", digits, self.median(), digits, lo, digits, hi, self.ratios.len())
            }
            None => format!("{:.*} (n={})", digits, self.median(), self.ratios.len()),
        }
    }

    /// `key` (the median), `key_ci95_low` / `_high` where there is an interval, and
    /// `key_min` / `_max` of the pairs.
    pub fn report(&self, report: &mut crate::Report, key: &str) {
        report.figure(key, self.median());
        if let Some((lo, hi)) = median_ci95(&self.ratios) {
            report.figure(&format!("{key}_ci95_low"), lo);
            report.figure(&format!("{key}_ci95_high"), hi);
        }
        let s = Summary::of(&self.ratios);
        report.figure(&format!("{key}_min"), s.min);
        report.figure(&format!("{key}_max"), s.max);
    }
}

/// `a / b`, or NaN when b is zero.
pub fn ratio(a: f64, b: f64) -> f64 {
    if b == 0.0 {
        f64::NAN
    } else {
        a / b
    }
}

/// A latency histogram in nanoseconds, 1 ns .. 100 s at 3 significant digits.
#[derive(Clone)]
pub struct Latency {
    hist: Histogram<u64>,
}

impl Default for Latency {
    fn default() -> Self {
        Self::new()
    }
}

/// Percentiles of a [`Latency`] in microseconds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct LatencySummary {
    pub count: u64,
    pub mean_us: f64,
    pub p50_us: f64,
    pub p99_us: f64,
    pub p999_us: f64,
    pub max_us: f64,
}

impl Latency {
    pub fn new() -> Self {
        Latency { hist: Histogram::new_with_bounds(1, 100_000_000_000, 3).expect("static bounds are valid") }
    }

    pub fn record(&mut self, d: Duration) {
        self.record_ns(d.as_nanos().min(u64::MAX as u128) as u64);
    }

    pub fn record_ns(&mut self, ns: u64) {
        self.hist.saturating_record(ns.max(1));
    }

    pub fn merge(&mut self, other: &Latency) {
        let _ = self.hist.add(&other.hist);
    }

    pub fn count(&self) -> u64 {
        self.hist.len()
    }

    /// Value at quantile `q` (0..=1) in microseconds.
    pub fn quantile_us(&self, q: f64) -> f64 {
        self.hist.value_at_quantile(q) as f64 / 1000.0
    }

    pub fn summary(&self) -> LatencySummary {
        if self.hist.is_empty() {
            return LatencySummary::default();
        }
        LatencySummary {
            count: self.hist.len(),
            mean_us: self.hist.mean() / 1000.0,
            p50_us: self.quantile_us(0.5),
            p99_us: self.quantile_us(0.99),
            p999_us: self.quantile_us(0.999),
            max_us: self.hist.max() as f64 / 1000.0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn median_ci95_uses_the_binomial_order_statistics() {
        let v: Vec<f64> = (1..=21).map(f64::from).collect();
        // Bin(21, 1/2): P(X <= 5) = 1.33%, P(X <= 6) = 3.9%: the 6th and the 16th values.
        assert_eq!(median_ci95(&v), Some((6.0, 16.0)));
        // n = 6: P(X <= 0) = 1.6%: the extremes. n = 5: P(X <= 0) = 3.1%: none.
        assert_eq!(median_ci95(&[3.0, 1.0, 2.0, 6.0, 5.0, 4.0]), Some((1.0, 6.0)));
        assert_eq!(median_ci95(&[1.0, 2.0, 3.0, 4.0, 5.0]), None);
        assert_eq!(median_ci95(&[]), None);
        // Large n stays finite and near the normal approximation n/2 -+ 0.98 sqrt(n).
        let big: Vec<f64> = (0..2000).map(f64::from).collect();
        let (lo, hi) = median_ci95(&big).unwrap();
        assert!((lo - 956.0).abs() <= 2.0 && (hi - 1043.0).abs() <= 2.0, "{lo} {hi}");
    }

    #[test]
    fn summary_of_known_values() {
        let s = Summary::of(&[3.0, 1.0, 2.0]);
        assert_eq!((s.median, s.min, s.max, s.mean, s.n), (2.0, 1.0, 3.0, 2.0, 3));
        assert_eq!(Summary::of(&[1.0, 2.0, 3.0, 4.0]).median, 2.5);
        assert_eq!(Summary::of(&[]).n, 0);
        assert!(ratio(1.0, 0.0).is_nan());
    }

    #[test]
    fn paired_ratios_pair_by_repetition_and_drop_empty_baselines() {
        let a = [2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0];
        let b = [1.0, 1.0, 2.0, 0.0, 3.0, 7.0, 4.0];
        let p = Paired::of(&a, &b, |x| *x);
        // The pair with a zero baseline is left out; six remain, in repetition order.
        assert_eq!(p.ratios, vec![2.0, 3.0, 2.0, 2.0, 1.0, 2.0]);
        assert_eq!(p.median(), 2.0);
        assert_eq!(p.display(1), "2.0 [1.0–3.0] (n=6)");
        // Unequal lengths pair only the common prefix; too few pairs give no interval.
        let short = Paired::of(&a[..2], &b, |x| *x);
        assert_eq!((short.median(), short.display(1)), (2.5, "2.5 (n=2)".to_string()));
        assert!(Paired::default().median().is_nan());
    }

    #[test]
    fn latency_percentiles() {
        let mut l = Latency::new();
        for us in 1..=100u64 {
            l.record(Duration::from_micros(us));
        }
        let s = l.summary();
        assert_eq!(s.count, 100);
        assert!((s.p50_us - 50.0).abs() < 0.1, "{s:?}");
        assert!((s.p99_us - 99.0).abs() < 0.1, "{s:?}");
        assert!((s.max_us - 100.0).abs() < 0.1, "{s:?}");
    }

    proptest! {
        #[test]
        fn median_lies_between_min_and_max(v in proptest::collection::vec(-1e9f64..1e9, 1..50)) {
            let s = Summary::of(&v);
            prop_assert!(s.min <= s.median && s.median <= s.max);
            prop_assert!(s.min <= s.mean + 1e-6 && s.mean <= s.max + 1e-6);
        }
    }
}
