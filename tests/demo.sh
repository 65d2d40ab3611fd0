#!/usr/bin/env bash
# The demo: starts the local control plane (building it on first use), the provisioning
# controller and the autoscaler simulator (cluster-autoscaler's behaviour, scaling the node
# group of tests/demo-node-groups.yaml), then submits two Jobs through a ProvisioningRequest
# check and narrates their pods and Nodes: Nodes added for the first Job's request, its pods
# scheduled and run there; the second Job waiting for room, then running on the same Nodes once
# the first is done; the Nodes removed once idle. The control plane keeps running afterwards so
# you can look around; `make down` stops it. The controller and the simulator stop with the
# demo; their logs stay in the control plane's run directory.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# shellcheck source=tests/demo-lib.sh
source tests/demo-lib.sh

CONTROLLER_NAME="demo.kueue-admission-checks.dev/provisioning-request"
NODE_GROUP="demo-pool"
METRICS="127.0.0.1:${DEMO_METRICS_PORT:-9464}"

# The Rust build runs beside the control plane's (on first use: the Go build of etcd,
# kube-apiserver and Kueue): each leaves a core idle at times (a long serial crate, a link).
mkdir -p target
# Only the three binaries the demo runs.
cargo build --quiet --locked -p kueue-provisioning-controller -p autoscaler-simulator -p demo \
  --bin kueue-provisioning-controller --bin autoscaler-simulator --bin demo \
  >target/demo-build.log 2>&1 &
cargo_pid=$!
trap 'kill "$cargo_pid" 2>/dev/null || true' EXIT
echo "[demo] building the controller, the simulator and the narrator (log: target/demo-build.log)"
bash tests/control-plane/control-plane.sh start
eval "$(bash tests/control-plane/control-plane.sh env)"
if ! wait "$cargo_pid"; then
  cat target/demo-build.log >&2
  echo "[demo] the build failed (log above, also in target/demo-build.log)" >&2
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

target/debug/kueue-provisioning-controller \
  --controller-name "$CONTROLLER_NAME" \
  --metrics-address "$METRICS" \
  --metrics-secure=false --health-address "$METRICS" \
  --leader-election-namespace default \
  >"$logs/demo-provisioning-controller.log" 2>&1 &
pids+=("$!")
# cluster-autoscaler's defaults but for the pace: a loop every 2 s (not 10), a retry 5 s after
# CapacityIsNotFound (not 1 min), idle Nodes removed after 5 s (not 10 min).
target/debug/autoscaler-simulator --node-groups tests/demo-node-groups.yaml \
  --scan-interval 2s --initial-backoff 5s --max-backoff 10s --scale-down-unneeded-time 5s --scale-down-delay-after-add 5s \
  >"$logs/demo-autoscaler-simulator.log" 2>&1 &
pids+=("$!")
echo "[demo] kueue-provisioning-controller (log: $logs/demo-provisioning-controller.log)"
echo "[demo] autoscaler-simulator scaling node group $NODE_GROUP (log: $logs/demo-autoscaler-simulator.log)"

wait_controller_ready "$METRICS" "${pids[0]}" "$logs/demo-provisioning-controller.log"

target/debug/demo --controller-name "$CONTROLLER_NAME" --node-group "$NODE_GROUP" --metrics-address "$METRICS"
