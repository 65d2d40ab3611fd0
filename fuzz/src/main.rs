//! `fuzz [--seconds N] [--seed S] [--list] [TARGET...]`: runs every target (or those named) for
//! N seconds in all, split evenly, from seed S (`FUZZ_SEED`, else the clock; always printed).
//! Exit code 1 with the input and the seed when a property breaks; the input is written under
//! `target/fuzz-crashes/<target>/`.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

fn main() -> ExitCode {
    let mut seconds: u64 = 60;
    let mut seed: Option<u64> = std::env::var("FUZZ_SEED").ok().and_then(|s| s.parse().ok());
    let mut names = Vec::new();
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--seconds" => match args.next().and_then(|v| v.parse().ok()) {
                Some(v) => seconds = v,
                None => return usage("--seconds takes a whole number"),
            },
            "--seed" => match args.next().and_then(|v| v.parse().ok()) {
                Some(v) => seed = Some(v),
                None => return usage("--seed takes a whole number"),
            },
            "--list" => {
                for t in fuzz_targets::all() {
                    println!(
                        "{:<20} {}\n{:<20} asserts: {}",
                        t.name, t.covers, "", t.asserts
                    );
                }
                return ExitCode::SUCCESS;
            }
            "-h" | "--help" => return usage(""),
            name => names.push(name.to_string()),
        }
    }
    let seed = seed.unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0)
    });
    let targets: Vec<_> = fuzz_targets::all()
        .into_iter()
        .filter(|t| names.is_empty() || names.iter().any(|n| n == t.name))
        .collect();
    if targets.is_empty() || targets.len() < names.len() {
        return usage(&format!("unknown target among {names:?}"));
    }
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let corpus_root = root.join("corpus");
    let crash_dir = root.join("../target/fuzz-crashes");
    let each = Duration::from_secs(seconds) / targets.len() as u32;
    println!(
        "fuzz: seed {seed} (FUZZ_SEED={seed} replays it), {} targets, {} s each",
        targets.len(),
        each.as_secs_f64()
    );
    let mut total = 0;
    for target in &targets {
        match fuzz_one(target, &corpus_root, seed, each, &crash_dir) {
            Some(inputs) => total += inputs,
            None => return ExitCode::FAILURE,
        }
    }
    println!("fuzz: {total} inputs, 0 failures (seed {seed})");
    ExitCode::SUCCESS
}

/// Fuzzes one target from its corpus for `time` and prints how it went; the inputs run, or
/// `None` when it has no corpus or a property broke.
fn fuzz_one(
    target: &fuzz_targets::Target,
    corpus_root: &Path,
    seed: u64,
    time: Duration,
    crash_dir: &Path,
) -> Option<u64> {
    let corpus = match fuzz_targets::runner::load_corpus(corpus_root, target.name) {
        Ok(files) => files
            .into_iter()
            .map(|(_, bytes)| bytes)
            .collect::<Vec<_>>(),
        Err(e) => {
            eprintln!("fuzz: no corpus for {}: {e}", target.name);
            return None;
        }
    };
    match fuzz_targets::run_target(target, &corpus, seed, time, Some(crash_dir)) {
        Ok(stats) => {
            println!(
                "  {:<20} {:>9} inputs, {:>3} % checkable, {} corpus files, {:.1} s: ok",
                stats.target,
                stats.inputs,
                stats.checked * 100 / stats.inputs.max(1),
                stats.corpus,
                stats.elapsed.as_secs_f64()
            );
            Some(stats.inputs)
        }
        Err(crash) => {
            eprintln!("\nfuzz: FAILED\n{crash}");
            None
        }
    }
}

fn usage(problem: &str) -> ExitCode {
    if !problem.is_empty() {
        eprintln!("fuzz: {problem}");
    }
    eprintln!("usage: fuzz [--seconds N] [--seed S] [--list] [TARGET...]");
    if problem.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(2)
    }
}
