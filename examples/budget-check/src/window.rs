//! Budgets and their windows: a day (from 00:00 UTC) or a week (from Monday 00:00 UTC).

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use k8s_openapi::jiff::Timestamp;

use crate::money::Credits;

const DAY: i64 = 86_400;

/// How long a budget lasts before it starts again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Period {
    /// 00:00 UTC to 00:00 UTC.
    Day,
    /// Monday 00:00 UTC to the next Monday 00:00 UTC.
    Week,
}

impl fmt::Display for Period {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Period::Day => "day",
            Period::Week => "week",
        })
    }
}

/// A namespace's budget: so many credits per day or per week.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Budget {
    /// Credits available in each window.
    pub limit: Credits,
    /// The window.
    pub period: Period,
}

impl FromStr for Budget {
    type Err = String;

    /// `500/week`, `40.5/day`.
    fn from_str(s: &str) -> Result<Self, String> {
        let (limit, period) = s
            .split_once('/')
            .ok_or_else(|| format!("{s:?} is not credits/day or credits/week (e.g. 500/week)"))?;
        let period = match period.trim() {
            "day" => Period::Day,
            "week" => Period::Week,
            other => return Err(format!("{other:?} is not a budget window: use day or week")),
        };
        Ok(Budget {
            limit: limit.trim().parse()?,
            period,
        })
    }
}

impl fmt::Display for Budget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.limit, self.period)
    }
}

/// The span a budget applies to: `[start, end)`, whole UTC days.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Window {
    /// First day, as days since 1970-01-01.
    pub first_day: i64,
    /// Day after the last, as days since 1970-01-01.
    pub end_day: i64,
}

impl Window {
    /// The window of `period` that contains `now`.
    pub fn containing(period: Period, now: Timestamp) -> Self {
        let today = day_of(now);
        match period {
            Period::Day => Window {
                first_day: today,
                end_day: today + 1,
            },
            Period::Week => {
                // 1970-01-01 was a Thursday: Monday is 3 days before it.
                let monday = today - (today + 3).rem_euclid(7);
                Window {
                    first_day: monday,
                    end_day: monday + 7,
                }
            }
        }
    }

    /// Whether `day` (days since 1970-01-01) lies in the window.
    pub fn contains_day(&self, day: i64) -> bool {
        (self.first_day..self.end_day).contains(&day)
    }

    /// When the window ends (and the next starts).
    pub fn end(&self) -> Timestamp {
        start_of_day(self.end_day)
    }

    /// How long from `now` until the window ends, to the nanosecond (a delay rounded here
    /// would be rounded again by whoever turns it into whole seconds); zero if it has ended.
    pub fn remaining(&self, now: Timestamp) -> Duration {
        Duration::try_from(self.end().duration_since(now)).unwrap_or(Duration::ZERO)
    }
}

/// Days since 1970-01-01 (UTC) of a time.
pub fn day_of(t: Timestamp) -> i64 {
    t.as_second().div_euclid(DAY)
}

/// 00:00 UTC of a day.
pub fn start_of_day(day: i64) -> Timestamp {
    Timestamp::from_second(day.saturating_mul(DAY)).unwrap_or(Timestamp::MAX)
}

/// `2026-11-23`, for ledger keys and messages.
pub fn format_day(day: i64) -> String {
    start_of_day(day).strftime("%Y-%m-%d").to_string()
}

/// The inverse of [`format_day`]: only its exact spelling. The date parser also takes
/// `20261123` and `+002026-11-23`; two ledger keys spelling one day differently would map to
/// one day and one of them would be lost.
pub fn parse_day(s: &str) -> Option<i64> {
    let date: k8s_openapi::jiff::civil::Date = s.parse().ok()?;
    let at = date.to_zoned(k8s_openapi::jiff::tz::TimeZone::UTC).ok()?;
    let day = day_of(at.timestamp());
    (format_day(day) == s).then_some(day)
}

/// `2026-11-23T00:00:00Z`.
pub fn format_time(t: Timestamp) -> String {
    t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn at(s: &str) -> Timestamp {
        s.parse().expect("timestamp")
    }

    #[test]
    fn budgets_parse_and_say_what_is_wrong() {
        assert_eq!(
            "500/week".parse(),
            Ok(Budget {
                limit: "500".parse().expect("credits"),
                period: Period::Week
            })
        );
        assert_eq!(
            "12.5 / day".parse::<Budget>().map(|b| b.to_string()),
            Ok("12.5/day".into())
        );
        assert_eq!(
            "500".parse::<Budget>(),
            Err("\"500\" is not credits/day or credits/week (e.g. 500/week)".into())
        );
        assert_eq!(
            "5/month".parse::<Budget>(),
            Err("\"month\" is not a budget window: use day or week".into())
        );
        assert!("-5/day".parse::<Budget>().is_err());
    }

    #[test]
    fn days_start_at_midnight_and_weeks_on_monday() {
        // 2026-11-26 is a Thursday.
        let now = at("2026-11-26T15:30:00Z");
        let day = Window::containing(Period::Day, now);
        assert_eq!(format_time(day.end()), "2026-11-27T00:00:00Z");
        assert_eq!(day.remaining(now), Duration::from_secs(8 * 3600 + 30 * 60));
        let just_after = at("2026-11-26T15:30:00.000000001Z");
        assert_eq!(
            day.remaining(just_after),
            Duration::from_nanos((8 * 3600 + 30 * 60) * 1_000_000_000 - 1)
        );
        let week = Window::containing(Period::Week, now);
        assert_eq!(format_day(week.first_day), "2026-11-23");
        assert_eq!(format_time(week.end()), "2026-11-30T00:00:00Z");
        // A Monday at midnight opens a new week; a Sunday just before it is in the old one.
        assert_eq!(
            Window::containing(Period::Week, at("2026-11-30T00:00:00Z")).first_day,
            week.end_day
        );
        assert_eq!(
            Window::containing(Period::Week, at("2026-11-29T23:59:59Z")),
            week
        );
        assert_eq!(parse_day("2026-11-23"), Some(week.first_day));
        assert_eq!(parse_day("23/11/2026"), None);
        // Other spellings of the same day would collide with it in the ledger.
        assert_eq!(parse_day("20261123"), None);
        assert_eq!(parse_day("+002026-11-23"), None);
    }

    proptest! {
        /// Every time lies in its window, the window is whole days of the period's length, and
        /// the time until it resets is positive and no longer than the period.
        #[test]
        fn windows_contain_their_time(secs in -2_000_000_000i64..4_000_000_000i64, weekly: bool) {
            let now = Timestamp::from_second(secs).expect("in range");
            let period = if weekly { Period::Week } else { Period::Day };
            let w = Window::containing(period, now);
            prop_assert!(w.contains_day(day_of(now)));
            prop_assert_eq!(w.end_day - w.first_day, if weekly { 7 } else { 1 });
            let left = w.remaining(now);
            let days: u64 = if weekly { 7 } else { 1 };
            prop_assert!(left > Duration::ZERO && left <= Duration::from_secs(days * 86_400));
            prop_assert_eq!(parse_day(&format_day(w.first_day)), Some(w.first_day));
        }
    }
}
