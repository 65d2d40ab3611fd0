//! Kubernetes resource quantities (`500m`, `2Gi`, `1e3`) as numbers.

use kueue_admission_sdk::api::{ExactQuantity, QuantityError};

/// The value of a quantity in its base unit (cores, bytes, devices), read exactly by the SDK
/// and then turned into a number. Negative quantities are refused: a request cannot be
/// negative.
pub fn parse_quantity(q: &str) -> Result<f64, String> {
    let exact: ExactQuantity = q.parse().map_err(|e: QuantityError| e.to_string())?;
    let bad = |why: &str| format!("{q:?} is not a resource quantity: {why}");
    if exact.is_negative() {
        return Err(bad("negative"));
    }
    let v = exact.to_f64();
    if v.is_finite() {
        Ok(v)
    } else {
        Err(bad("too large"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_every_suffix_kind() {
        for (q, v) in [
            ("2", 2.0),
            ("500m", 0.5),
            ("1.5", 1.5),
            ("1Gi", 1073741824.0),
            ("512Mi", 536870912.0),
            ("1k", 1000.0),
            ("1e3", 1000.0),
            ("2E-1", 0.2),
            ("+3", 3.0),
        ] {
            let parsed = parse_quantity(q).expect(q);
            assert!((parsed - v).abs() < 1e-9 * v.max(1.0), "{q}: {parsed}");
        }
        // `+-1` and `++1` were read as -1 and refused only by luck (found by property testing).
        for bad in ["", "-1", "1x", "Gi", "1e", "1e999", "+-1", "++1", "+-0.5Gi"] {
            assert!(parse_quantity(bad).is_err(), "{bad:?}");
        }
    }

    proptest::proptest! {
        /// Whatever the text, a quantity read is a finite, non-negative number.
        #[test]
        fn never_negative_nor_infinite(q in "[-+0-9.eEkKMGTPimun]{0,12}") {
            if let Ok(v) = parse_quantity(&q) {
                proptest::prop_assert!(v.is_finite() && v >= 0.0, "{q:?} read as {v}");
            }
        }
    }
}
