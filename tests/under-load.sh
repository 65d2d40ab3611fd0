#!/usr/bin/env bash
# The end-to-end suite run several times in a row with a CPU hog on every core beside it
# (`make test-under-load`): a suite that asserts causes, not time windows, passes all of them.
#
#   RUNS=3            how many full runs
#   FILTER=           only tests whose name contains this (cargo test's filter)
#   UNDER_LOAD_HOGS=  how many busy loops (default: one per core)
#   E2E_THREADS=4     test threads, as in make test
#
# Every test binary runs even after a failure (--no-fail-fast). Prints one line per run (passed,
# failed, seconds) and a summary; each run's output is kept under target/under-load/. Exits
# non-zero if any run failed.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# shellcheck source=tests/e2e-suite.sh
source tests/e2e-suite.sh
runs="${RUNS:-3}"
hogs="${UNDER_LOAD_HOGS:-$(nproc)}"
threads="${E2E_THREADS:-4}"
filter=("${FILTER:-}")
[[ -n ${FILTER:-} ]] || filter=()
out=target/under-load
mkdir -p "$out"

cp=tests/control-plane/control-plane.sh
started_here=false
if ! bash "$cp" status >/dev/null 2>&1; then
  started_here=true
  bash "$cp" start
fi
E2E_HELM="$(bash tests/helm/install-helm.sh)"
export E2E_HELM
# Built before the hogs start: the runs measure the suite, not the compiler.
cargo test -p e2e -p bench --locked --no-run --quiet

hog_pids=()
stop() {
  for pid in "${hog_pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  if $started_here; then bash "$cp" stop; fi
}
trap stop EXIT
for _ in $(seq "$hogs"); do
  ( while :; do :; done ) &
  hog_pids+=("$!")
done
echo "under load: $hogs busy loops on $(nproc) cores, $runs runs, $threads test threads${FILTER:+, filter $FILTER}"

failed_runs=0
total_start=$SECONDS
for run in $(seq "$runs"); do
  run_e2e_suite "run $run" "$out/run-$run.log" --test-threads "$threads" "${filter[@]}" ||
    failed_runs=$((failed_runs + 1))
done
echo "under load: $runs runs, $failed_runs failed, $((SECONDS - total_start)) s in all; $(git rev-parse --short HEAD), $(date -u +%Y-%m-%d)"
((failed_runs == 0))
