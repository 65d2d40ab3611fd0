//! Every corpus file replayed through its target: each input a fuzz run ever broke a property
//! with is kept here once fixed, so the fix stays. Also checks that every target has a corpus
//! and every corpus folder a target (a renamed target would otherwise lose its regressions).

use std::path::PathBuf;

#[test]
fn every_corpus_file_keeps_every_property() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("corpus");
    let targets = fuzz_targets::all();
    let mut replayed = 0;
    let mut failures = Vec::new();
    for target in &targets {
        let files = fuzz_targets::runner::load_corpus(&root, target.name)
            .unwrap_or_else(|e| panic!("target {} has no corpus folder: {e}", target.name));
        assert!(
            !files.is_empty(),
            "target {} has an empty corpus",
            target.name
        );
        for (path, bytes) in files {
            replayed += 1;
            match fuzz_targets::runner::run_one(target, &bytes) {
                Ok(true) => {}
                // A corpus file the target cannot read checks nothing: a stale or broken seed.
                Ok(false) => failures.push(format!("{}: not a case of its target", path.display())),
                Err(message) => failures.push(format!("{}: {message}", path.display())),
            }
        }
    }
    for entry in std::fs::read_dir(&root).expect("fuzz/corpus") {
        let name = entry.expect("an entry").file_name();
        let name = name.to_string_lossy();
        assert!(
            targets.iter().any(|t| t.name == name),
            "fuzz/corpus/{name} belongs to no target"
        );
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert!(replayed >= targets.len());
}

/// A short, fixed-seed run of every target: the fuzzer itself works and finds nothing new in
/// a few seconds (the real runs are `make fuzz` and the step in `tests/run-all.sh`).
#[test]
fn a_short_run_of_every_target_finds_nothing() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("corpus");
    for target in fuzz_targets::all() {
        let corpus: Vec<Vec<u8>> = fuzz_targets::runner::load_corpus(&root, target.name)
            .expect("corpus")
            .into_iter()
            .map(|(_, b)| b)
            .collect();
        let stats = fuzz_targets::run_target(
            &target,
            &corpus,
            1,
            std::time::Duration::from_millis(150),
            None,
        )
        .unwrap_or_else(|crash| panic!("{crash}"));
        assert!(
            stats.inputs > corpus.len() as u64,
            "{}: no mutant ran",
            target.name
        );
        // Most mutants must still be cases, or the run only tests the JSON parser.
        assert!(
            stats.checked * 4 >= stats.inputs,
            "{}: only {} of {} inputs were cases",
            target.name,
            stats.checked,
            stats.inputs
        );
    }
}
