#!/usr/bin/env bash
# The Karpenter demo: starts the local control plane and Karpenter v1.14.1 beside it (its kwok
# provider, the CapacityBuffer gate on; both built on first use), and the capacity-buffer check
# (capacity-buffer-controller/), then submits a Job through it and narrates its pods, Nodes and
# NodeClaims: a CapacityBuffer made at the quota reservation, Karpenter launching Nodes for it,
# the Nodes protected and the buffer shrunk at Ready, the pods running there, the protection
# ended once they are bound, and the Nodes consolidated once the Job is done. The control plane
# and Karpenter keep running afterwards; `make down` stops both. The controller stops with the
# demo; its log stays in the control plane's run directory.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# shellcheck source=tests/demo-lib.sh
source tests/demo-lib.sh

CONTROLLER_NAME="demo.kueue-admission-checks.dev/capacity-buffer"
METRICS="127.0.0.1:${DEMO_METRICS_PORT:-9465}"

mkdir -p target
cargo build --quiet --locked -p kueue-capacity-buffer-controller -p demo \
  --bin kueue-capacity-buffer-controller --bin karpenter-demo \
  >target/demo-karpenter-build.log 2>&1 &
cargo_pid=$!
trap 'kill "$cargo_pid" 2>/dev/null || true' EXIT
echo "[demo] building the controller and the narrator (log: target/demo-karpenter-build.log)"
bash tests/control-plane/control-plane.sh start
bash tests/control-plane/control-plane.sh start-karpenter
eval "$(bash tests/control-plane/control-plane.sh env)"
if ! wait "$cargo_pid"; then
  cat target/demo-karpenter-build.log >&2
  echo "[demo] the build failed (log above, also in target/demo-karpenter-build.log)" >&2
  exit 1
fi
logs="$KUEUE_AC_RUN_DIR/logs"
mkdir -p "$logs"

pids=()
stop() {
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
}
trap stop EXIT

target/debug/kueue-capacity-buffer-controller \
  --controller-name "$CONTROLLER_NAME" \
  --metrics-address "$METRICS" \
  --metrics-secure=false --health-address "$METRICS" \
  --leader-election-namespace default \
  >"$logs/demo-capacity-buffer-controller.log" 2>&1 &
pids+=("$!")
echo "[demo] kueue-capacity-buffer-controller (log: $logs/demo-capacity-buffer-controller.log)"

wait_controller_ready "$METRICS" "${pids[0]}" "$logs/demo-capacity-buffer-controller.log"

target/debug/karpenter-demo --controller-name "$CONTROLLER_NAME" --metrics-address "$METRICS"
