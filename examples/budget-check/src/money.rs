//! Credits: the unit budgets and costs are counted in, as whole thousandths so that charges and
//! refunds add up exactly.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// An amount of credits, stored in thousandths.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Credits(pub u64);

impl Credits {
    /// No credits.
    pub const ZERO: Credits = Credits(0);

    /// From thousandths of a credit.
    pub const fn from_milli(milli: u64) -> Self {
        Credits(milli)
    }

    /// In thousandths of a credit.
    pub const fn milli(self) -> u64 {
        self.0
    }

    /// Whether this is nothing.
    pub const fn is_zero(self) -> bool {
        self.0 == 0
    }

    /// Sum, saturating: a ledger never wraps around.
    pub const fn saturating_add(self, other: Credits) -> Credits {
        Credits(self.0.saturating_add(other.0))
    }

    /// Difference, never below zero.
    pub const fn saturating_sub(self, other: Credits) -> Credits {
        Credits(self.0.saturating_sub(other.0))
    }
}

impl fmt::Display for Credits {
    /// `12`, `12.5`, `0.001`: no trailing zeros.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (whole, frac) = (self.0 / 1000, self.0 % 1000);
        if frac == 0 {
            write!(f, "{whole}")
        } else {
            let digits = format!("{frac:03}");
            write!(f, "{whole}.{}", digits.trim_end_matches('0'))
        }
    }
}

impl FromStr for Credits {
    type Err = String;

    /// A non-negative decimal with at most three decimals: `500`, `12.5`, `0.001`.
    fn from_str(s: &str) -> Result<Self, String> {
        let bad =
            || format!("{s:?} is not an amount of credits (e.g. 500 or 12.5, at most 3 decimals)");
        let (whole, frac) = s.split_once('.').unwrap_or((s, ""));
        let digits = |d: &str| d.bytes().all(|b| b.is_ascii_digit());
        if whole.is_empty()
            || !digits(whole)
            || !digits(frac)
            || frac.len() > 3
            || (s.contains('.') && frac.is_empty())
        {
            return Err(bad());
        }
        let whole: u64 = whole.parse().map_err(|_| bad())?;
        let frac: u64 = if frac.is_empty() {
            0
        } else {
            format!("{frac:0<3}").parse().map_err(|_| bad())?
        };
        whole
            .checked_mul(1000)
            .and_then(|m| m.checked_add(frac))
            .map(Credits)
            .ok_or_else(bad)
    }
}

impl Serialize for Credits {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Credits {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn parses_and_prints_decimals_exactly() {
        for (text, milli, shown) in [
            ("500", 500_000, "500"),
            ("12.5", 12_500, "12.5"),
            ("0.001", 1, "0.001"),
            ("0.120", 120, "0.12"),
            ("0", 0, "0"),
        ] {
            let c: Credits = text.parse().expect(text);
            assert_eq!(c.milli(), milli, "{text}");
            assert_eq!(c.to_string(), shown, "{text}");
        }
        for bad in [
            "",
            "-1",
            "1.",
            ".5",
            "1.2345",
            "1e3",
            "ten",
            "+1",
            "99999999999999999999",
        ] {
            assert!(bad.parse::<Credits>().is_err(), "{bad:?}");
        }
    }

    proptest! {
        #[test]
        fn printing_then_parsing_gives_the_same_amount(milli in 0u64..u64::MAX / 1000) {
            let c = Credits(milli);
            prop_assert_eq!(c.to_string().parse::<Credits>(), Ok(c));
        }
    }
}
