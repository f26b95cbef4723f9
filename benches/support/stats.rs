//! Repeated wall-clock measurements, summarised: the median with a distribution-free confidence
//! interval (order statistics, no assumption on the distribution) and the minimum.

/// A summary of repeated measurements of one figure.
#[derive(Clone, Debug, PartialEq)]
pub struct Spread {
    /// How many measurements.
    pub n: usize,
    /// The smallest.
    pub min: f64,
    /// The median (the mean of the two middle values when `n` is even).
    pub median: f64,
    /// The confidence interval of the median: `[lo, hi]`, two order statistics.
    pub lo: f64,
    /// Its upper end.
    pub hi: f64,
    /// The interval's exact coverage (at least 0.95 when `n >= 6`; the whole range below that).
    pub coverage: f64,
}

impl Spread {
    /// The summary of `samples`; `None` when there are none (or one is not a number).
    pub fn of(samples: &[f64]) -> Option<Self> {
        if samples.is_empty() || samples.iter().any(|v| v.is_nan()) {
            return None;
        }
        let mut v = samples.to_vec();
        v.sort_by(f64::total_cmp);
        let n = v.len();
        let median = if n % 2 == 1 {
            v[n / 2]
        } else {
            0.5 * (v[n / 2 - 1] + v[n / 2])
        };
        // [x_(k), x_(n+1-k)] covers the median with probability 1 - 2 P(Bin(n, 1/2) < k): the
        // largest k with coverage >= 95%, else k = 1 (the whole range).
        let mut k = 1;
        let mut below = binomial_half(n, 0); // P(Bin < 1)
        let mut coverage = 1.0 - 2.0 * below;
        while k < n.div_ceil(2) {
            let next_below = below + binomial_half(n, k);
            let next = 1.0 - 2.0 * next_below;
            if next < 0.95 {
                break;
            }
            k += 1;
            below = next_below;
            coverage = next;
        }
        Some(Spread {
            n,
            min: v[0],
            median,
            lo: v[k - 1],
            hi: v[n - k],
            coverage,
        })
    }

    /// `median M (CI% [lo, hi], min m, n = N)` with values multiplied by `scale` and shown in
    /// `unit` to three decimals.
    pub fn describe(&self, scale: f64, unit: &str) -> String {
        format!(
            "median {:.3} {unit} ({:.1}% CI [{:.3}, {:.3}], min {:.3}, n = {})",
            self.median * scale,
            self.coverage * 100.0,
            self.lo * scale,
            self.hi * scale,
            self.min * scale,
            self.n
        )
    }
}

/// `P(Bin(n, 1/2) = i)`.
fn binomial_half(n: usize, i: usize) -> f64 {
    // C(n, i) / 2^n, built as a product so that it stays finite for large n.
    (0..i).fold(0.5f64.powi(n as i32), |p, j| {
        p * (n - j) as f64 / (j + 1) as f64
    })
}
