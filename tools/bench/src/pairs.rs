//! Pure: the order of repeated runs (ABBA pairs) and the spread of what they measured.
//!
//! One pair runs every side once. Pair 1 runs the sides in the order given, pair 2 in the
//! reverse order, and so on: a side that gains from running first (a fresh API server cache,
//! an emptier etcd) or last (a warmer page cache) gains in half the pairs only. Ratios are taken
//! within one pair, never across pairs.

/// The runs of `repeat` pairs of `sides`: `(pair, side)` in the order they run, pairs counted
/// from 1; odd pairs in the given order, even pairs reversed.
pub fn abba<T: Copy>(sides: &[T], repeat: u32) -> Vec<(u32, T)> {
    (1..=repeat)
        .flat_map(|pair| {
            let mut order: Vec<T> = sides.to_vec();
            if pair % 2 == 0 {
                order.reverse();
            }
            order.into_iter().map(move |side| (pair, side))
        })
        .collect()
}

/// The median of some values with their least and greatest.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Spread {
    /// The median (of an even count: the mean of the middle two).
    pub median: f64,
    /// The least value.
    pub min: f64,
    /// The greatest value.
    pub max: f64,
    /// How many values.
    pub n: usize,
}

impl Spread {
    /// The spread of `values`; `None` when there are none or one is not a number.
    pub fn of(values: &[f64]) -> Option<Self> {
        if values.is_empty() || values.iter().any(|v| v.is_nan()) {
            return None;
        }
        let mut sorted = values.to_vec();
        sorted.sort_by(f64::total_cmp);
        let n = sorted.len();
        let median = if n % 2 == 1 {
            sorted[n / 2]
        } else {
            (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0
        };
        Some(Self {
            median,
            min: sorted[0],
            max: sorted[n - 1],
            n,
        })
    }
}

impl std::fmt::Display for Spread {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.n == 1 {
            return write!(f, "{:.2} (one pair)", self.median);
        }
        write!(
            f,
            "{:.2} (range {:.2} to {:.2}, {} pairs)",
            self.median, self.min, self.max, self.n
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pairs_alternate_the_order_so_each_side_runs_first_in_half_of_them() {
        let runs = abba(&['A', 'B'], 4);
        let order: String = runs.iter().map(|(_, s)| *s).collect();
        assert_eq!(order, "ABBAABBA");
        let pairs: Vec<u32> = runs.iter().map(|(p, _)| *p).collect();
        assert_eq!(pairs, [1, 1, 2, 2, 3, 3, 4, 4]);
        // More sides: the whole list reversed in even pairs.
        let three: String = abba(&['n', 'k', 'o'], 2).iter().map(|(_, s)| *s).collect();
        assert_eq!(three, "nkookn");
        assert!(abba(&['A'], 0).is_empty());
    }

    #[test]
    fn the_spread_is_the_median_and_the_range() {
        let s = Spread::of(&[0.9, 0.7, 0.8]).expect("values");
        assert_eq!((s.median, s.min, s.max, s.n), (0.8, 0.7, 0.9, 3));
        let even = Spread::of(&[1.0, 0.5, 0.75, 0.25]).expect("values");
        assert_eq!(even.median, 0.625);
        assert_eq!(Spread::of(&[]), None);
        assert_eq!(Spread::of(&[1.0, f64::NAN]), None);
        assert_eq!(
            Spread::of(&[0.8, 0.7]).map(|s| s.to_string()).as_deref(),
            Some("0.75 (range 0.70 to 0.80, 2 pairs)")
        );
        assert_eq!(
            Spread::of(&[0.8]).map(|s| s.to_string()).as_deref(),
            Some("0.80 (one pair)")
        );
    }
}
