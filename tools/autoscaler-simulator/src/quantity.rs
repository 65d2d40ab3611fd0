//! Resource quantities (`100m`, `16Gi`, `1.5`, `2e3`) as whole milli-units, rounded up like
//! Kubernetes' `MilliValue`, so every resource (cpu, memory, pods, extended ones) compares in one
//! integer unit. The simulator keeps its own parser: a test oracle should not share the parsing
//! of the code it tests.

/// Why a text is not a resource quantity.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{text:?} is not a resource quantity: {why}")]
pub struct QuantityError {
    text: String,
    why: &'static str,
}

/// The binary (power of 1024) and decimal (power of 10) factor of a suffix.
fn suffix_factor(suffix: &str) -> Option<(u32, i32)> {
    Some(match suffix {
        "" => (0, 0),
        "n" => (0, -9),
        "u" => (0, -6),
        "m" => (0, -3),
        "k" => (0, 3),
        "M" => (0, 6),
        "G" => (0, 9),
        "T" => (0, 12),
        "P" => (0, 15),
        "E" => (0, 18),
        "Ki" => (1, 0),
        "Mi" => (2, 0),
        "Gi" => (3, 0),
        "Ti" => (4, 0),
        "Pi" => (5, 0),
        "Ei" => (6, 0),
        _ => return None,
    })
}

/// The quantity in milli-units, rounded up (`1.0001m` is 2). Negative quantities are refused:
/// requests, capacities and allocatables never are.
pub fn parse_milli(text: &str) -> Result<i128, QuantityError> {
    let bad = |why| QuantityError {
        text: text.to_string(),
        why,
    };
    let trimmed = text.trim();
    let rest = trimmed.strip_prefix('+').unwrap_or(trimmed);
    if rest.starts_with('-') {
        return Err(bad("negative"));
    }
    let number_end = rest
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(rest.len());
    let (number, suffix) = rest.split_at(number_end);
    let (integer, fraction) = number.split_once('.').unwrap_or((number, ""));
    if (integer.is_empty() && fraction.is_empty()) || fraction.contains('.') {
        return Err(bad("no number"));
    }
    let (binary, mut exponent) = match suffix_factor(suffix) {
        Some(factor) => factor,
        None => decimal_exponent(suffix)
            .map(|e| (0, e))
            .ok_or(bad("unknown suffix"))?,
    };
    let mut mantissa: u128 = 0;
    for digit in integer.bytes().chain(fraction.bytes()) {
        mantissa = mantissa
            .checked_mul(10)
            .and_then(|m| m.checked_add(u128::from(digit - b'0')))
            .ok_or(bad("too large"))?;
    }
    let fraction_digits = i32::try_from(fraction.len()).map_err(|_| bad("too long"))?;
    exponent = exponent
        .checked_add(3)
        .and_then(|e| e.checked_sub(fraction_digits))
        .ok_or(bad("exponent out of range"))?;
    let mut value = mantissa
        .checked_mul(1024u128.checked_pow(binary).ok_or(bad("too large"))?)
        .ok_or(bad("too large"))?;
    if exponent >= 0 {
        let scale = 10u128
            .checked_pow(exponent.unsigned_abs())
            .ok_or(bad("too large"))?;
        value = value.checked_mul(scale).ok_or(bad("too large"))?;
    } else {
        // Beyond 10^38 every u128 rounds up to 1 (or stays 0).
        let scale = 10u128
            .checked_pow(exponent.unsigned_abs())
            .unwrap_or(u128::MAX);
        value = value.div_ceil(scale);
    }
    i128::try_from(value).map_err(|_| bad("too large"))
}

/// `e<int>` / `E<int>`: a decimal exponent.
fn decimal_exponent(suffix: &str) -> Option<i32> {
    let digits = suffix
        .strip_prefix('e')
        .or_else(|| suffix.strip_prefix('E'))?;
    let unsigned = digits
        .strip_prefix('-')
        .or_else(|| digits.strip_prefix('+'))
        .unwrap_or(digits);
    if unsigned.is_empty() || !unsigned.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
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
