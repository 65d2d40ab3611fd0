//! The whole machine's CPU, from `/proc/stat`: what every process used during a run (the
//! control plane's, the benchmark's own, and anything else), and how busy each core was.

use anyhow::{Context, Result};

/// Busy and total time of one CPU line of `/proc/stat`, in clock ticks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Ticks {
    /// user, nice, system, irq, softirq and steal.
    pub busy: u64,
    /// busy, idle and iowait.
    pub total: u64,
}

/// The machine's CPU times at one moment: all cores together and each core.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CpuTimes {
    /// The `cpu` line.
    pub all: Ticks,
    /// The `cpuN` lines, in order.
    pub cores: Vec<Ticks>,
}

/// Reads `/proc/stat` now.
pub fn read() -> Result<CpuTimes> {
    let text = std::fs::read_to_string("/proc/stat").context("reading /proc/stat")?;
    parse(&text)
}

/// Parses the CPU lines of a `/proc/stat`.
pub fn parse(text: &str) -> Result<CpuTimes> {
    let mut times = CpuTimes::default();
    let mut found_all = false;
    for line in text.lines() {
        let mut fields = line.split_ascii_whitespace();
        let Some(name) = fields.next().filter(|n| n.starts_with("cpu")) else {
            continue;
        };
        let values: Vec<u64> = fields
            .map(str::parse)
            .collect::<Result<_, _>>()
            .with_context(|| format!("a /proc/stat line that is not numbers: {line:?}"))?;
        // user nice system idle iowait irq softirq steal (guest time is inside user).
        let at = |i: usize| values.get(i).copied().unwrap_or(0);
        anyhow::ensure!(values.len() >= 4, "a short /proc/stat line: {line:?}");
        let busy = at(0) + at(1) + at(2) + at(5) + at(6) + at(7);
        let ticks = Ticks {
            busy,
            total: busy + at(3) + at(4),
        };
        if name == "cpu" {
            times.all = ticks;
            found_all = true;
        } else {
            times.cores.push(ticks);
        }
    }
    anyhow::ensure!(found_all, "no cpu line in /proc/stat");
    Ok(times)
}

/// What the machine's CPU did between two readings.
#[derive(Clone, Debug, PartialEq)]
pub struct MachineCpu {
    /// CPU seconds used by every process together.
    pub busy_seconds: f64,
    /// Their share of what all cores could give (0 to 1).
    pub utilization: f64,
    /// Each core's share of its time busy (0 to 1).
    pub cores: Vec<f64>,
}

/// The use between `before` and `after`, with `ticks_per_second` clock ticks a second.
pub fn between(before: &CpuTimes, after: &CpuTimes, ticks_per_second: f64) -> MachineCpu {
    let share = |b: Ticks, a: Ticks| {
        let total = a.total.saturating_sub(b.total);
        if total == 0 {
            0.0
        } else {
            a.busy.saturating_sub(b.busy) as f64 / total as f64
        }
    };
    MachineCpu {
        busy_seconds: after.all.busy.saturating_sub(before.all.busy) as f64 / ticks_per_second,
        utilization: share(before.all, after.all),
        cores: before
            .cores
            .iter()
            .zip(&after.cores)
            .map(|(b, a)| share(*b, *a))
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BEFORE: &str = "cpu  100 0 50 800 50 0 0 0 0 0\ncpu0 60 0 30 400 10 0 0 0 0 0\ncpu1 40 0 20 400 40 0 0 0 0 0\nintr 1 2 3\n";
    const AFTER: &str = "cpu  250 10 90 850 50 5 5 0 0 0\ncpu0 200 10 70 410 10 5 5 0 0 0\ncpu1 50 0 20 440 40 0 0 0 0 0\n";

    #[test]
    fn busy_time_and_each_cores_share_come_from_the_cpu_lines() {
        let (b, a) = (
            parse(BEFORE).expect("parses"),
            parse(AFTER).expect("parses"),
        );
        assert_eq!(
            b.all,
            Ticks {
                busy: 150,
                total: 1000
            }
        );
        assert_eq!(b.cores.len(), 2);
        let used = between(&b, &a, 100.0);
        // 210 busy ticks more of 260 in all.
        assert!((used.busy_seconds - 2.1).abs() < 1e-9, "{used:?}");
        assert!((used.utilization - 210.0 / 260.0).abs() < 1e-9, "{used:?}");
        // cpu0: 200 busy of 210; cpu1: 10 of 50.
        assert!((used.cores[0] - 200.0 / 210.0).abs() < 1e-9, "{used:?}");
        assert!((used.cores[1] - 0.2).abs() < 1e-9, "{used:?}");
    }

    #[test]
    fn a_stat_without_numbers_or_a_cpu_line_is_an_error() {
        assert!(parse("cpu  a b c d\n").is_err());
        assert!(parse("intr 1 2\n").is_err());
        assert!(parse("cpu 1 2\n").is_err());
    }
}
