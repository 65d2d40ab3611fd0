//! The comparison benchmark (`bench-compare`, docs/benchmark.md) on a small scale, so that it
//! keeps working, and so that a regression of our controller's API requests per Workload fails
//! here: it runs Kueue's built-in check and ours on 40 Workloads of one and of three podsets (the budget the performance targets name).

use std::process::Command;
use std::sync::Mutex;

use anyhow::{Result, ensure};
use bench::Creating;
use e2e::TestEnv;

/// One bench-compare at a time: each deletes the Workloads of earlier runs' namespaces first.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// The most API requests per admitted Workload our controller may send in the smoke run,
/// beside [`MAX_REQUESTS_PER_PODSET`] for each podset: on the provisioning path it sends a
/// PodTemplate create per podset, the request's create, one status write (`Ready`: a request no
/// autoscaler has looked at yet is not announced, see the provisioning README) and an Event:
/// 3 + 1 per podset, 4.0 with one podset and 6.0 with three, and 0.05 for the rare 409 of the
/// status write. A second status write per Workload, or a read or patch per template, fails here.
const MAX_REQUESTS_PER_WORKLOAD: &str = "3.05";
/// What each podset adds to [`MAX_REQUESTS_PER_WORKLOAD`]: its PodTemplate.
const MAX_REQUESTS_PER_PODSET: &str = "1";

#[test]
fn both_controllers_admit_every_workload_once_and_ours_stays_within_its_request_budget()
-> Result<()> {
    let _one = ONE_AT_A_TIME
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let plots = std::env::temp_dir().join(format!("bench-compare-smoke-{}", std::process::id()));
    let out = Command::new(env!("CARGO_BIN_EXE_bench-compare"))
        .args([
            "--workloads",
            "40",
            "--podsets",
            "1,3",
            "--timeout-seconds",
            "180",
        ])
        .arg("--plots")
        .arg(&plots)
        .args(["--max-requests-per-workload", MAX_REQUESTS_PER_WORKLOAD])
        .args(["--max-requests-per-podset", MAX_REQUESTS_PER_PODSET])
        .env("KUBECONFIG", e2e::kubeconfig_path())
        .output()?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    ensure!(
        out.status.success(),
        "bench-compare failed:\n{stdout}\n{stderr}"
    );
    for expected in [
        "| Kueue built-in | 40 × 1 |",
        "| ours | 40 × 1 |",
        "| Kueue built-in | 40 × 3 |",
        "| ours | 40 × 3 |",
        "40 × 3, pair 1: reserved → Ready p99, ours / built-in = ",
        "40 × 3: reserved → Ready p99, ours / built-in: ",
    ] {
        ensure!(
            stdout.contains(expected),
            "{expected:?} missing from:\n{stdout}"
        );
    }
    // Kueue ran under its shipped limiter in every run; each run says how close it came.
    ensure!(
        stderr
            .matches("Kueue's client limiter (300/s, burst 500): it sent ")
            .count()
            == 4,
        "Kueue's limiter use missing from:\n{stderr}"
    );
    for evidence in [
        "the cluster at the start: ",
        "the whole machine: ",
        "the benchmark's own watches: ",
    ] {
        ensure!(
            stderr.matches(evidence).count() == 4,
            "{evidence:?} not in every run's details:\n{stderr}"
        );
    }
    // One plot per size, each with both controllers.
    for size in ["40x1", "40x3"] {
        let svg = std::fs::read_to_string(plots.join(format!("{size}.svg")))?;
        ensure!(
            svg.contains("Kueue built-in (p99") && svg.contains("ours (p99"),
            "the plot of {size} lacks a controller"
        );
    }
    std::fs::remove_dir_all(&plots)?;
    // Each run's details go to stderr, with our controller's reconcile queue and the time from
    // a reservation to our request (read from our metrics: NaN if a series went missing).
    let ours: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with("our reconcile queue: "))
        .collect();
    ensure!(
        ours.len() == 2,
        "our reconcile queue missing from:\n{stderr}"
    );
    for line in ours {
        ensure!(
            line.contains("our requests were created within ") && !line.contains("NaN"),
            "a measure missing from {line:?}"
        );
    }
    // How busy our turns were (the 10 main ones and the 10 kept for early starts), and when
    // each mark came first and last, in every run of ours (the windows in every run).
    ensure!(
        stderr.matches("our 20 turns were busy for ").count() == 2,
        "our turns' use missing from:\n{stderr}"
    );
    ensure!(
        stderr
            .matches("first and last, in s after the first create: quota reserved ")
            .count()
            == 4,
        "the marks' windows missing from:\n{stderr}"
    );
    // The API server's time on each of our creates, from the audit log's stage timestamps: a
    // mean of 0 ms would mean they were not read.
    let creates: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with("| check | create provisioningrequests | "))
        .collect();
    ensure!(creates.len() == 2, "our creates missing from:\n{stderr}");
    for line in creates {
        let mean: f64 = line.split('|').nth(4).unwrap_or_default().trim().parse()?;
        ensure!(mean > 0.0, "no server time in {line:?}");
    }
    // The entry mark is recorded: from the check's entry (with quota) to its request takes some
    // time in each run of the built-in check, where a mark never set would print 0.00 (no
    // durations). Ours makes its request at the reservation, mostly before the entry: 0 there
    // is what it should be, so only a number is required.
    let entry_to_request: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with("| check's entry with quota → request seen (the check) | "))
        .collect();
    ensure!(
        entry_to_request.len() == 4,
        "the entry → request stage missing from:\n{stderr}"
    );
    // In run order: built-in, ours, built-in, ours.
    for (i, line) in entry_to_request.into_iter().enumerate() {
        let p50: f64 = line.split('|').nth(2).unwrap_or_default().trim().parse()?;
        let built_in = i % 2 == 0;
        ensure!(
            p50 >= 0.0 && (!built_in || p50 > 0.0),
            "no entry → request time in {line:?}"
        );
    }
    Ok(())
}

/// The idle Workloads and the background stream, small: bench-compare waits until Kueue has
/// settled on the idle Workloads before the first run, and both runs carry the same stream,
/// which flows (created, admitted and deleted) during each.
#[test]
fn idle_workloads_settle_before_the_runs_and_both_runs_carry_the_same_churn() -> Result<()> {
    let _one = ONE_AT_A_TIME
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    // What an interrupted earlier run leaves: Workloads in a namespace of bench-compare's.
    let runtime = tokio::runtime::Runtime::new()?;
    let leftover = runtime.block_on(async {
        let env = TestEnv::new("cmp-leftover").await?;
        let creating = Creating {
            prefix: "left",
            count: 3,
            podsets: 1,
            concurrency: 3,
        };
        bench::create_workloads(&env, creating, None).await?;
        anyhow::Ok(env)
    })?;
    let plots = std::env::temp_dir().join(format!("bench-compare-churn-{}", std::process::id()));
    let out = Command::new(env!("CARGO_BIN_EXE_bench-compare"))
        .args(["--workloads", "20", "--podsets", "1"])
        .args(["--idle-workloads", "30", "--churn-per-second", "2"])
        .args(["--timeout-seconds", "240"])
        .arg("--plots")
        .arg(&plots)
        .env("KUBECONFIG", e2e::kubeconfig_path())
        .output()?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let all = format!("{stdout}\n{stderr}");
    ensure!(out.status.success(), "bench-compare failed:\n{all}");
    let _ = std::fs::remove_dir_all(&plots);
    let left = runtime.block_on(async {
        let listed = leftover.workloads().list(&Default::default()).await?;
        anyhow::Ok(listed.items.len())
    })?;
    ensure!(
        left == 0 && all.contains("Workloads left by earlier runs in "),
        "{left} Workloads of an earlier run's namespace {} were not deleted first:\n{all}",
        leftover.ns
    );
    ensure!(
        all.contains("bench-compare: deleted the 30 idle Workloads in "),
        "the idle Workloads were not deleted at the end:\n{all}"
    );
    ensure!(
        all.contains("bench-compare: Kueue settled on 30 idle Workloads after ")
            && all.contains("every one has QuotaReserved=False"),
        "no settle line in:\n{all}"
    );
    let churn: Vec<&str> = all
        .lines()
        .filter(|l| l.starts_with("background churn: 2 Workloads/s"))
        .collect();
    ensure!(churn.len() == 2, "a churn line per run expected in:\n{all}");
    for line in churn {
        // "... admission): N created (the rate's M), A admitted, D deleted; ..."
        let counts = line.split("admission): ").nth(1).unwrap_or_default();
        let number_before = |word: &str| -> u32 {
            let before = counts.split(word).next().unwrap_or_default();
            let last = before
                .trim_end()
                .rsplit([' ', '(', ','])
                .next()
                .unwrap_or_default();
            last.parse().unwrap_or(0)
        };
        let (created, admitted) = (number_before(" created"), number_before(" admitted"));
        ensure!(
            created > 0 && admitted > 0,
            "the stream did not flow: {line:?}"
        );
    }
    Ok(())
}

/// The references and the fair budget, in two ABBA pairs: the runs go in the order given, then
/// reversed; Kueue runs without its client limiter and is restarted as shipped at the end; each
/// ratio is reported per pair and as a median with its range.
#[test]
fn references_and_the_fair_budget_run_in_abba_pairs_with_ratios_within_each() -> Result<()> {
    let _one = ONE_AT_A_TIME
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let plots = std::env::temp_dir().join(format!("bench-compare-abba-{}", std::process::id()));
    let out = Command::new(env!("CARGO_BIN_EXE_bench-compare"))
        .args(["--workloads", "20", "--podsets", "1"])
        .args(["--controllers", "none,floor,kueue,ours", "--repeat", "2"])
        .args(["--budget", "fair", "--timeout-seconds", "180"])
        .arg("--plots")
        .arg(&plots)
        .env("KUBECONFIG", e2e::kubeconfig_path())
        .output()?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let all = format!("{stdout}\n{stderr}");
    let _ = std::fs::remove_dir_all(&plots);
    ensure!(out.status.success(), "bench-compare failed:\n{all}");
    let order: Vec<&str> = stderr
        .lines()
        .filter_map(|l| l.strip_prefix("bench-compare: pair "))
        .filter_map(|l| l.split(" with ").next())
        .collect();
    ensure!(
        order
            == [
                "1: no check",
                "1: always-ready floor",
                "1: Kueue built-in",
                "1: ours",
                "2: ours",
                "2: Kueue built-in",
                "2: always-ready floor",
                "2: no check",
            ],
        "runs not in ABBA order: {order:?}"
    );
    ensure!(
        all.contains("Kueue restarted with client QPS -1")
            && all.contains("Kueue restarted with client QPS 300"),
        "Kueue not run without its limiter, or not restored:\n{all}"
    );
    ensure!(
        !all.contains("Kueue's client limiter (300/s"),
        "a limiter reported under the fair budget:\n{all}"
    );
    for row in [
        "| no check | 20 × 1 |",
        "| always-ready floor | 20 × 1 |",
        "| Kueue built-in | 20 × 1 |",
        "| ours | 20 × 1 |",
    ] {
        ensure!(
            stdout.matches(row).count() == 2,
            "{row:?} not twice in:\n{stdout}"
        );
    }
    for line in [
        "20 × 1, pair 1: reserved → Ready p99, ours / built-in = ",
        "20 × 1, pair 2: reserved → Ready p99, ours / floor = ",
        "20 × 1, pair 2: whole-machine CPU per 1,000 Workloads beyond the no-check run's: ours ",
        "20 × 1: reserved → Ready p99, ours / built-in: ",
        "20 × 1: reserved → Ready p99, ours / floor: ",
        "20 × 1: created → admitted p99, ours / built-in: ",
        "the check 100000/100000",
    ] {
        ensure!(stdout.contains(line), "{line:?} missing from:\n{stdout}");
    }
    ensure!(
        stdout.matches(" pairs).").count() >= 3,
        "no median with its range over the 2 pairs in:\n{stdout}"
    );
    // The floor's own queue is reported as the floor's, with nothing it cannot have.
    let floor: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with("the floor's reconcile queue: "))
        .collect();
    ensure!(
        floor.len() == 2 && floor.iter().all(|l| !l.contains("NaN")),
        "the floor's queue lines: {floor:?}"
    );
    Ok(())
}

/// Paced arrivals after the burst: at half the built-in's burst throughput for a few seconds,
/// for both controllers, with the pace it came to and a ratio within the pair.
#[test]
fn paced_runs_follow_the_burst_at_a_fraction_of_the_built_ins_throughput() -> Result<()> {
    let _one = ONE_AT_A_TIME
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let plots = std::env::temp_dir().join(format!("bench-compare-paced-{}", std::process::id()));
    let out = Command::new(env!("CARGO_BIN_EXE_bench-compare"))
        .args([
            "--workloads",
            "20",
            "--podsets",
            "1",
            "--timeout-seconds",
            "180",
        ])
        .args(["--paced", "0.5", "--paced-seconds", "4"])
        .arg("--plots")
        .arg(&plots)
        .env("KUBECONFIG", e2e::kubeconfig_path())
        .output()?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let _ = std::fs::remove_dir_all(&plots);
    ensure!(
        out.status.success(),
        "bench-compare failed:\n{stdout}\n{stderr}"
    );
    for row in [
        "| Kueue built-in, paced at 50 % (",
        "| ours, paced at 50 % (",
    ] {
        ensure!(stdout.contains(row), "{row:?} missing from:\n{stdout}");
    }
    let line = stdout
        .lines()
        .find(|l| l.contains(" paced at 50 % (") && l.contains(", pair 1: reserved → Ready p99"))
        .ok_or_else(|| anyhow::anyhow!("no paced comparison in:\n{stdout}"))?;
    // "20 × 1 paced at 50 % (4.3/s) ...": the pace is half the burst's throughput, so fewer
    // than 20 Workloads a second here, and a count of pace × 4 s rounded. The pace is printed to
    // a tenth, so the printed pace × 4 s is within 0.2 of the exact one: the count is within
    // 0.5 + 0.2 of it (19 Workloads at a printed 4.9/s, for an exact 4.87/s, is right).
    let pace: f64 = line
        .split("paced at 50 % (")
        .nth(1)
        .and_then(|r| r.split("/s)").next())
        .unwrap_or_default()
        .parse()?;
    let count: f64 = line.split(' ').next().unwrap_or_default().trim().parse()?;
    ensure!(
        pace > 0.0 && (count - pace * 4.0).abs() <= 0.7 + 1e-9,
        "{line}"
    );
    Ok(())
}
