//! The time box: run a target on its corpus, then on mutants until the time is up or an input
//! panics. A panic is the target's way of saying a property broke.

use std::cell::RefCell;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::mutate::mutant;
use crate::rng::Rng;
use crate::targets::Target;

/// What a run did.
#[derive(Clone, Debug)]
pub struct Stats {
    /// The target's name.
    pub target: &'static str,
    /// Inputs run, corpus included.
    pub inputs: u64,
    /// Inputs that were cases the target could read, so properties were checked.
    pub checked: u64,
    /// Corpus files replayed first.
    pub corpus: usize,
    /// How long it ran.
    pub elapsed: Duration,
}

/// An input that broke a property.
#[derive(Clone, Debug)]
pub struct Crash {
    /// The target's name.
    pub target: &'static str,
    /// The seed of the run that found it (`None` for a corpus file).
    pub seed: Option<u64>,
    /// The input.
    pub input: Vec<u8>,
    /// The panic message and where it was raised.
    pub message: String,
    /// Where the input was written, if it was.
    pub saved: Option<PathBuf>,
}

impl std::fmt::Display for Crash {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let text = String::from_utf8_lossy(&self.input);
        let shown: String = text.chars().take(4000).collect();
        writeln!(f, "target {} broke: {}", self.target, self.message)?;
        if let Some(seed) = self.seed {
            writeln!(f, "seed: {seed} (replay: FUZZ_SEED={seed})")?;
        }
        if let Some(path) = &self.saved {
            writeln!(
                f,
                "input saved to {} (copy it into fuzz/corpus/{}/ once fixed)",
                path.display(),
                self.target
            )?;
        }
        write!(f, "input ({} bytes): {shown}", self.input.len())
    }
}

thread_local! {
    /// Set while this thread runs a target: its panics are recorded here, not printed.
    static CAPTURE: RefCell<Option<Option<String>>> = const { RefCell::new(None) };
}

/// One process-wide hook, installed once: it records the panics of threads running a target
/// and hands every other panic to the hook that was there before. (Swapping hooks per input
/// would race between test threads and could leave the quiet hook installed for good.)
fn install_hook() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let captured = CAPTURE.with(|c| {
                let mut c = c.borrow_mut();
                let slot = c.as_mut()?;
                let payload = info
                    .payload()
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| info.payload().downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "a panic without a message".into());
                let at = info
                    .location()
                    .map(|l| format!(" at {}:{}", l.file(), l.line()))
                    .unwrap_or_default();
                *slot = Some(format!("{payload}{at}"));
                Some(())
            });
            if captured.is_none() {
                previous(info);
            }
        }));
    });
}

/// Runs `input` through `target`: whether it was a case the target could read, or `Err` with
/// the panic message if a property broke.
pub fn run_one(target: &Target, input: &[u8]) -> Result<bool, String> {
    install_hook();
    let run = target.run;
    CAPTURE.with(|c| *c.borrow_mut() = Some(None));
    let outcome = std::panic::catch_unwind(|| run(input));
    let message = CAPTURE.with(|c| c.borrow_mut().take()).flatten();
    outcome.map_err(|_| message.unwrap_or_else(|| "panicked".into()))
}

/// The corpus files of `target` under `root` (`fuzz/corpus`), sorted by name.
pub fn load_corpus(root: &Path, target: &str) -> std::io::Result<Vec<(PathBuf, Vec<u8>)>> {
    let dir = root.join(target);
    let mut files = Vec::new();
    for entry in std::fs::read_dir(&dir)? {
        let path = entry?.path();
        if path.is_file() {
            let bytes = std::fs::read(&path)?;
            files.push((path, bytes));
        }
    }
    files.sort();
    Ok(files)
}

/// Replays `corpus`, then runs mutants for `time` from `seed`. The first broken property is
/// returned as a [`Crash`], its input written under `crash_dir` when given.
pub fn run_target(
    target: &Target,
    corpus: &[Vec<u8>],
    seed: u64,
    time: Duration,
    crash_dir: Option<&Path>,
) -> Result<Stats, Crash> {
    let start = Instant::now();
    let crash = |input: &[u8], message: String, seed: Option<u64>| {
        let saved = crash_dir.and_then(|dir| save(dir, target.name, input).ok());
        Crash {
            target: target.name,
            seed,
            input: input.to_vec(),
            message,
            saved,
        }
    };
    let mut checked = 0;
    for input in corpus {
        checked += u64::from(run_one(target, input).map_err(|m| crash(input, m, None))?);
    }
    // Targets without a corpus start from nothing: byte mutants of empty input.
    let seeds: Vec<Vec<u8>> = if corpus.is_empty() {
        vec![Vec::new()]
    } else {
        corpus.to_vec()
    };
    let mut rng = Rng::new(seed ^ fnv(target.name.as_bytes()));
    let mut inputs = corpus.len() as u64;
    // Mutants of mutants reach further; the chain restarts from the corpus now and then.
    let mut current = rng.pick(&seeds).clone();
    loop {
        if inputs.is_multiple_of(64) && start.elapsed() >= time {
            break;
        }
        if rng.one_in(16) {
            current = rng.pick(&seeds).clone();
        }
        let next = mutant(&current, &mut rng);
        let was_case = run_one(target, &next).map_err(|m| crash(&next, m, Some(seed)))?;
        checked += u64::from(was_case);
        inputs += 1;
        // The chain goes on from a mutant that was still a case; one that was not would only
        // drift further from what reaches the code under test.
        if was_case && next.len() < 64 * 1024 {
            current = next;
        }
    }
    Ok(Stats {
        target: target.name,
        inputs,
        checked,
        corpus: corpus.len(),
        elapsed: start.elapsed(),
    })
}

fn save(dir: &Path, target: &str, input: &[u8]) -> std::io::Result<PathBuf> {
    let dir = dir.join(target);
    std::fs::create_dir_all(&dir)?;
    let path = dir.join(format!("crash-{:016x}", fnv(input)));
    std::fs::write(&path, input)?;
    Ok(path)
}

/// FNV-1a: a stable name for an input and a per-target seed offset.
fn fnv(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
    })
}
