# shellcheck shell=bash
# What the demos share; sourced by tests/demo.sh and tests/demo-karpenter.sh.

# wait_controller_ready METRICS PID LOG: returns once the controller serving METRICS is ready
# (its caches synced) and holds its leader Lease. Fails, with the tail of LOG, if the process
# PID exits first or that takes more than a minute.
wait_controller_ready() {
  local metrics=$1 pid=$2 log=$3
  for _ in $(seq 1 120); do
    if curl -fsS "http://$metrics/readyz" >/dev/null 2>&1 &&
      curl -fsS "http://$metrics/metrics" 2>/dev/null | grep -q '^kueue_ac_leader 1'; then
      return 0
    fi
    if ! kill -0 "$pid" 2>/dev/null; then
      echo "[demo] the controller exited:" >&2
      tail -20 "$log" >&2
      return 1
    fi
    sleep 0.5
  done
  echo "[demo] the controller was not ready and leading within a minute:" >&2
  tail -20 "$log" >&2
  return 1
}
