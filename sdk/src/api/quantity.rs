//! Kubernetes resource quantities (`500m`, `2Gi`, `1e3`) read exactly, as the API server
//! reads them: so that equal amounts compare equal however they are written, and a check can
//! turn one into a number without parsing the suffixes itself.

use std::fmt;
use std::str::FromStr;

/// A resource quantity, exactly: ± mantissa × 10^exponent, binary suffixes multiplied out
/// (`1Ki` is 1024e0). Equal amounts are equal values (`1`, `1000m` and `1e0` all read as
/// 1e0).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ExactQuantity {
    negative: bool,
    /// Without trailing zeros (they are moved into the exponent); 0 only for zero.
    mantissa: u128,
    exponent: i64,
}

/// Why a text is not a resource quantity.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{text:?} is not a resource quantity: {why}")]
pub struct QuantityError {
    text: String,
    why: &'static str,
}

impl ExactQuantity {
    /// Whether it is below zero (a request or limit never is).
    pub fn is_negative(&self) -> bool {
        self.negative
    }

    /// The closest `f64` (infinite if it is beyond `f64`'s range).
    pub fn to_f64(&self) -> f64 {
        self.to_string().parse().unwrap_or(f64::NAN)
    }

    /// The amount in thousandths, rounded up as Kubernetes' `MilliValue` rounds a positive
    /// amount (`100m` is 100, `1.0001m` is 2, `1Ki` is 1,024,000), so every resource compares in
    /// one integer unit; a negative amount is rounded towards zero. `None` beyond `i128`.
    pub fn milli_ceil(&self) -> Option<i128> {
        let power = self.exponent.checked_add(3)?;
        let magnitude = if power >= 0 {
            let scale = 10u128.checked_pow(u32::try_from(power).ok()?)?;
            self.mantissa.checked_mul(scale)?
        } else {
            // Beyond 10^38 every mantissa rounds up to 1 (or stays 0).
            let scale = u32::try_from(-power)
                .ok()
                .and_then(|p| 10u128.checked_pow(p))
                .unwrap_or(u128::MAX);
            if self.negative {
                self.mantissa / scale
            } else {
                self.mantissa.div_ceil(scale)
            }
        };
        let magnitude = i128::try_from(magnitude).ok()?;
        Some(if self.negative { -magnitude } else { magnitude })
    }
}

impl fmt::Display for ExactQuantity {
    /// The canonical form: `0`, or `[-]<mantissa>e<exponent>` (e.g. `5e-1` for `500m`).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.mantissa == 0 {
            return f.write_str("0");
        }
        let sign = if self.negative { "-" } else { "" };
        write!(f, "{sign}{}e{}", self.mantissa, self.exponent)
    }
}

impl FromStr for ExactQuantity {
    type Err = QuantityError;

    fn from_str(text: &str) -> Result<Self, QuantityError> {
        let bad = |why| QuantityError {
            text: text.to_string(),
            why,
        };
        let trimmed = text.trim();
        let (negative, rest) = match trimmed.as_bytes().first() {
            Some(b'-') => (true, &trimmed[1..]),
            Some(b'+') => (false, &trimmed[1..]),
            _ => (false, trimmed),
        };
        let number_end = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let (number, suffix) = rest.split_at(number_end);
        let (integer, fraction) = number.split_once('.').unwrap_or((number, ""));
        if (integer.is_empty() && fraction.is_empty()) || fraction.contains('.') {
            return Err(bad("no number"));
        }
        let too_large = || bad("too large");
        let mut mantissa: u128 = 0;
        for digit in integer.bytes().chain(fraction.bytes()) {
            mantissa = mantissa
                .checked_mul(10)
                .and_then(|m| m.checked_add(u128::from(digit - b'0')))
                .ok_or_else(too_large)?;
        }
        let mut exponent = -i64::try_from(fraction.len()).map_err(|_| too_large())?;
        match binary_power(suffix) {
            Some(power) => mantissa = mantissa.checked_mul(1 << power).ok_or_else(too_large)?,
            None => exponent += decimal_power(suffix).ok_or_else(|| bad("unknown suffix"))?,
        }
        if mantissa == 0 {
            return Ok(Self {
                negative: false,
                mantissa: 0,
                exponent: 0,
            });
        }
        while mantissa.is_multiple_of(10) {
            mantissa /= 10;
            exponent += 1;
        }
        Ok(Self {
            negative,
            mantissa,
            exponent,
        })
    }
}

fn binary_power(suffix: &str) -> Option<u32> {
    Some(match suffix {
        "Ki" => 10,
        "Mi" => 20,
        "Gi" => 30,
        "Ti" => 40,
        "Pi" => 50,
        "Ei" => 60,
        _ => return None,
    })
}

/// The power of ten of a decimal SI suffix or an exponent (`e3`, `E-1`, `e+2`).
fn decimal_power(suffix: &str) -> Option<i64> {
    Some(match suffix {
        "" => 0,
        "n" => -9,
        "u" => -6,
        "m" => -3,
        "k" => 3,
        "M" => 6,
        "G" => 9,
        "T" => 12,
        "P" => 15,
        "E" => 18,
        _ => {
            let digits = suffix.strip_prefix(['e', 'E'])?;
            let unsigned = digits.strip_prefix('+').unwrap_or(digits);
            if unsigned.is_empty() || unsigned.starts_with('+') {
                return None;
            }
            // Bounded so that adding the fraction's length can never overflow.
            unsigned.parse::<i64>().ok().filter(|p| p.abs() < 1 << 40)?
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(text: &str) -> ExactQuantity {
        text.parse().expect(text)
    }

    #[test]
    fn equal_amounts_read_the_same_whatever_the_suffix() {
        for (a, b) in [
            ("1", "1000m"),
            ("1000m", "1e0"),
            ("1k", "1e3"),
            ("0.5", "500m"),
            ("+3", "3"),
            ("1Ki", "1024"),
            ("0", "0Gi"),
            ("-0", "0"),
            ("2E-1", "200m"),
            ("1e+2", "100"),
        ] {
            assert_eq!(q(a), q(b), "{a} and {b}");
        }
        assert_eq!(q("500m").to_string(), "5e-1");
        assert_eq!(q("1Gi").to_string(), "1073741824e0");
        assert_eq!(q("-2k").to_string(), "-2e3");
        assert!(q("-1").is_negative());
    }

    #[test]
    fn thousandths_round_up_as_milli_value_does() {
        for (text, milli) in [
            ("100m", Some(100)),
            ("1", Some(1000)),
            ("1.5", Some(1500)),
            ("1Ki", Some(1_024_000)),
            ("16Gi", Some(16 * (1i128 << 30) * 1000)),
            ("5e-1", Some(500)),
            ("1u", Some(1)),
            ("1.0001m", Some(2)),
            ("-1.5m", Some(-1)),
            ("0", Some(0)),
            ("1e40", None),
        ] {
            assert_eq!(q(text).milli_ceil(), milli, "{text}");
        }
    }

    #[test]
    fn numbers_and_refusals() {
        assert_eq!(q("1.5").to_f64(), 1.5);
        assert_eq!(q("512Mi").to_f64(), 536_870_912.0);
        assert_eq!(q("1e999").to_f64(), f64::INFINITY);
        for bad in [
            "",
            "1x",
            "Gi",
            "1e",
            "+-1",
            "++1",
            "1.2.3",
            ".",
            "1e++2",
            "1e99999999999999",
        ] {
            let err = bad.parse::<ExactQuantity>().expect_err(bad);
            assert!(
                err.to_string().contains("is not a resource quantity"),
                "{err}"
            );
        }
        let overflow = format!("{}Ei", "9".repeat(30));
        assert!(overflow.parse::<ExactQuantity>().is_err());
    }

    proptest::proptest! {
        /// A quantity read back from its canonical form is the same quantity.
        #[test]
        fn the_canonical_form_reads_back_the_same(text in "[-+]?[0-9]{1,8}(\\.[0-9]{1,4})?(m|k|Ki|Mi|G|e-?[0-9])?") {
            if let Ok(read) = text.parse::<ExactQuantity>() {
                proptest::prop_assert_eq!(read.to_string().parse::<ExactQuantity>().ok(), Some(read));
            }
        }
    }
}
