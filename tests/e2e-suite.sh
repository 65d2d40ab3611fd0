# shellcheck shell=bash
# One run of the whole end-to-end suite, as `make test-kueue-versions` and `make test-under-load`
# repeat it (sourced by both): every test binary runs even after a failure; prints one line with
# the counts and time, then the failing tests; returns non-zero if any failed.
run_e2e_suite() { # label, log file, arguments for the test binaries...
  local label=$1 log=$2 start=$SECONDS verdict=ok passed failed
  shift 2
  cargo test -p e2e -p bench --locked --no-fail-fast -- "$@" >"$log" 2>&1 || verdict=FAILED
  passed=$(grep -Eo '[0-9]+ passed' "$log" | awk '{s += $1} END {print s + 0}')
  failed=$(grep -Eo '[0-9]+ failed' "$log" | awk '{s += $1} END {print s + 0}')
  echo "$label: $verdict, $passed passed, $failed failed, $((SECONDS - start)) s (log: $log)"
  [[ $verdict == ok ]] && return 0
  grep -E '^test .* FAILED$|^---- ' "$log" | head -20 | sed 's/^/  /' || true
  return 1
}
