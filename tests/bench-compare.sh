#!/usr/bin/env bash
# The comparison benchmark (docs/benchmark.md): Kueue's built-in ProvisioningRequest check and
# ours on the same work. Starts the local control plane if needed, builds the benchmark, the
# provisioning controller, the autoscaler simulator and the always-ready check (the floor) in
# release mode, and runs it. Arguments go to the benchmark, e.g. `make bench-compare ARGS="--workloads 300 --podsets 1"`.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash tests/control-plane/control-plane.sh start
# A separate target directory: a release build never waits on the debug build's lock.
target_dir="${BENCH_TARGET_DIR:-target/bench}"
CARGO_TARGET_DIR="$target_dir" cargo build --quiet --release --locked \
  -p bench -p kueue-provisioning-controller -p autoscaler-simulator -p e2e \
  --bin bench-compare --bin kueue-provisioning-controller --bin autoscaler-simulator \
  --bin always-ready
# The benchmark renders the controller's RBAC from the Helm chart.
E2E_HELM="${E2E_HELM:-$(bash tests/helm/install-helm.sh | tail -1)}"
export E2E_HELM
"$target_dir/release/bench-compare" "$@"
