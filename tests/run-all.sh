#!/usr/bin/env bash
# Every check this project has, in the order a failure is cheapest to find: formatting, lints,
# docs, unit tests, then the end-to-end suite against the real control plane.
# The control plane is started if needed and stopped again if this run started it.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
cp=tests/control-plane/control-plane.sh
step() { printf '\n=== %s\n' "$*"; }

step "shellcheck"
command -v shellcheck >/dev/null || { echo "shellcheck is required (Debian: apt-get install shellcheck)"; exit 1; }
shellcheck -x tests/control-plane/*.sh tests/helm/*.sh tests/*.sh .ci/run

step "cargo fmt --check"
cargo fmt --all --check

# The control plane's binaries (cold: a Go build of several minutes) build beside the Rust
# steps below; each leaves a core idle at times (a long serial crate, a link). Waited for before
# the fuzz step, which is timed and should have the machine to itself.
step "building the control plane (and Karpenter) in the background (log: target/control-plane-build.log)"
mkdir -p target
# Karpenter is started only by the capacity-buffer suites; built here so that they do not wait.
{ bash "$cp" build && bash tests/control-plane/build.sh karpenter; } >target/control-plane-build.log 2>&1 &
build_pid=$!
trap 'kill "$build_pid" 2>/dev/null || true' EXIT

step "cargo clippy --all-targets -D warnings"
cargo clippy --workspace --all-targets --locked -- -D warnings

step "cargo doc (warnings are errors)"
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --locked --quiet

step "unit tests"
cargo test --workspace --exclude e2e --exclude bench --locked

step "building the end-to-end tests and the binaries they start"
cargo test -p e2e -p bench --locked --no-run
bash tests/soak.sh build

step "waiting for the background builds"
if ! wait "$build_pid"; then
  cat target/control-plane-build.log
  echo "the control plane did not build (log above, also in target/control-plane-build.log)"
  exit 1
fi
tail -1 target/control-plane-build.log

step "fuzz: every pure target, 45 s in all, fixed seed"
# A fixed seed, so that a run fails for a change and not for the day's luck; make fuzz explores
# with fresh seeds. FUZZ_SEED overrides.
cargo run --locked -q -p fuzz-targets -- --seconds 45 --seed "${FUZZ_SEED:-20261124}"

step "local control plane"
started_here=false
if ! bash "$cp" status >/dev/null 2>&1; then
  started_here=true
  # A control plane that cannot start fails the run here, with the reason: never skipped.
  bash "$cp" start
fi
static_pid=""
cleanup() {
  if [[ -n $static_pid ]]; then kill "$static_pid" 2>/dev/null || true; fi
  if $started_here; then bash "$cp" stop; fi
}
trap cleanup EXIT
bash "$cp" status

step "Helm charts: lint, render, assertions, alerts, restricted Pod Security Standard on the apiserver"
bash tests/helm/check-chart.sh

# The release build of the container image's static binary (its own target dir; cold, minutes)
# runs beside the end-to-end suite, which needs nothing of it; the suite passes with a busy
# loop on every core beside it (make test-under-load). Checked after the suite.
bash tests/helm/static-binary.sh build >target/static-binary-build.log 2>&1 &
static_pid=$!

step "end-to-end tests against etcd, kube-apiserver and Kueue (and Karpenter for the capacity-buffer check)"
# chart_rbac renders the chart with this helm (built and cached by the chart checks above).
E2E_HELM="$(bash tests/helm/install-helm.sh)"
export E2E_HELM
# Tests share the control plane; each uses its own namespace, so they may run in parallel.
# The benchmarks' smoke tests (tools/bench) drive the same cluster: they run with the suite.
if ! cargo test -p e2e -p bench --locked -- --test-threads "${E2E_THREADS:-4}"; then
  echo "the controllers the tests ran in process logged to target/debug/e2e-logs/<test binary>.log;" \
    "the control plane to logs/ in its run directory (until its next start)" >&2
  exit 1
fi

step "the container image's static binary"
if ! wait "$static_pid"; then
  cat target/static-binary-build.log
  echo "the static binary did not build (log above, also in target/static-binary-build.log)"
  exit 1
fi
bash tests/helm/static-binary.sh

step "short chaos soak: 100 Workloads, leaders killed, apiserver and Kueue restarted"
# After the suite: it restarts the shared apiserver and Kueue, which would fail tests running
# beside it. A fixed seed, so that a run fails for a change and not for the day's plan.
SOAK_WORKLOADS=100 SOAK_SEED="${SOAK_SEED:-20261125}" bash tests/soak.sh
