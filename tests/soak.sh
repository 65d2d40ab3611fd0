#!/usr/bin/env bash
# The chaos soak of docs/reliability.md: builds the controllers and the soak driver, starts the
# local control plane and Karpenter if they are not running, and runs the soak against them.
# Nothing else may use the control plane meanwhile: the soak restarts its apiserver, Kueue and
# Karpenter.
#
#   SOAK_WORKLOADS   Workloads in all (default 1000)
#   SOAK_SEED        replay a run's seed (default: a fresh one, printed first)
#   SOAK_IN_FLIGHT   Workloads under way at once at most (default 60)
# Results, the controllers' logs and the offending Workloads' timelines: target/soak/<seed>/.
# With the argument `build`, only builds.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
cargo build --locked -q -p kueue-provisioning-controller -p kueue-capacity-buffer-controller -p autoscaler-simulator -p license-check -p budget-check -p soak --bins
[[ ${1:-} == build ]] && exit 0
bash tests/control-plane/control-plane.sh start
# The capacity-buffer check's queue needs the real Karpenter (built on first use).
bash tests/control-plane/control-plane.sh start-karpenter
exec "${CARGO_TARGET_DIR:-target}/debug/soak" "$@"
