//! Resource quantities (`100m`, `16Gi`, `1.5`, `2e3`) as whole milli-units, rounded up like
//! Kubernetes' `MilliValue`, so every resource (cpu, memory, pods, extended ones) compares in one
//! integer unit. Read by the SDK's exact quantity parser ([`ExactQuantity`]); this module only
//! refuses what a request, a capacity or an allocatable never is.

use kueue_admission_sdk::api::ExactQuantity;

/// Why a text is not a resource quantity the simulator can count with.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum QuantityError {
    /// Not a quantity at all.
    #[error(transparent)]
    Unreadable(#[from] kueue_admission_sdk::api::QuantityError),
    /// A quantity below zero.
    #[error("{0:?} is not a resource quantity: negative")]
    Negative(String),
    /// More thousandths than an `i128` holds.
    #[error("{0:?} is not a resource quantity: too large")]
    TooLarge(String),
}

/// The quantity in milli-units, rounded up (`1.0001m` is 2). Negative quantities are refused:
/// requests, capacities and allocatables never are.
pub fn parse_milli(text: &str) -> Result<i128, QuantityError> {
    let quantity: ExactQuantity = text.parse()?;
    if quantity.is_negative() {
        return Err(QuantityError::Negative(text.to_string()));
    }
    quantity
        .milli_ceil()
        .ok_or_else(|| QuantityError::TooLarge(text.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn quantities_read_as_milli_units() {
        for (text, milli) in [
            ("100m", 100),
            ("1", 1000),
            ("1.5", 1500),
            ("0.1", 100),
            ("16Gi", 16 * (1i128 << 30) * 1000),
            ("1Ki", 1_024_000),
            ("2k", 2_000_000),
            ("1M", 1_000_000_000),
            ("2e3", 2_000_000),
            ("1E3", 1_000_000),
            ("5e-1", 500),
            ("1u", 1),
            ("1n", 1),
            ("0", 0),
            ("1.0001m", 2),
            (" 3 ", 3000),
            ("+2", 2000),
            (".5", 500),
            ("110", 110_000),
        ] {
            assert_eq!(parse_milli(text), Ok(milli), "{text}");
        }
    }

    #[test]
    fn bad_quantities_are_refused() {
        for text in [
            "",
            "m",
            "-1",
            "1.2.3",
            "1x",
            "1Gb",
            "e3",
            "1e",
            "1e+",
            "99999999999999999999999999999999999999Ei",
        ] {
            assert!(parse_milli(text).is_err(), "{text}");
        }
    }

    proptest! {
        #[test]
        fn parsing_never_panics(text in ".{0,30}") {
            let _ = parse_milli(&text);
        }

        #[test]
        fn millis_round_trip(milli in 0i64..i64::MAX) {
            prop_assert_eq!(parse_milli(&format!("{milli}m")), Ok(i128::from(milli)));
        }
    }
}
