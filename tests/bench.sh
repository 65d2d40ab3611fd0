#!/usr/bin/env bash
# The benchmark (docs/benchmark.md): starts the local control plane if needed, builds the
# always-ready check and the benchmark in release mode, and runs it. Arguments go to the
# benchmark, e.g. `make bench ARGS="--workloads 500 -- --kube-api-qps 50 --kube-api-burst 100"`.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash tests/control-plane/control-plane.sh start
# A separate target directory: a release build never waits on the debug build's lock.
target_dir="${BENCH_TARGET_DIR:-target/bench}"
CARGO_TARGET_DIR="$target_dir" cargo build --quiet --release --locked -p e2e -p bench --bin always-ready --bin bench
"$target_dir/release/bench" "$@"
