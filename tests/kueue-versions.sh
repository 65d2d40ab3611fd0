#!/usr/bin/env bash
# The whole end-to-end suite against each supported Kueue version, one after another on the local
# control plane (`make test-kueue-versions`): the README's supported range is what this run shows.
#
#   KUEUE_VERSIONS="v0.15.2 v0.19.2"   the versions (default: the oldest and the newest supported)
#   E2E_THREADS=4                      test threads, as in make test
#
# Each version's Kueue is built on first use (about 5 minutes) and cached; the control plane is
# restarted on empty data for each. Every test binary runs even after a failure. Prints one line
# per version and keeps each log under target/kueue-versions/; exits non-zero if any failed. The
# control plane is left running the configured version.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
read -r -a versions <<<"${KUEUE_VERSIONS:-v0.15.2 v0.19.2}"
threads="${E2E_THREADS:-4}"
out=target/kueue-versions
mkdir -p "$out"
cp=tests/control-plane/control-plane.sh
E2E_HELM="$(bash tests/helm/install-helm.sh)"
export E2E_HELM
cargo test -p e2e --locked --no-run --quiet

failed_versions=0
for version in "${versions[@]}"; do
  start=$SECONDS
  log="$out/$version.log"
  # Exported for the suite too: its harness starts the control plane it finds configured.
  export KUEUE_VERSION="$version"
  bash "$cp" stop >/dev/null 2>&1 || true
  bash "$cp" start >"$out/$version.start.log" 2>&1 ||
    { cat "$out/$version.start.log" >&2; echo "kueue $version: the control plane did not start" >&2; exit 1; }
  if cargo test -p e2e --locked --no-fail-fast -- --test-threads "$threads" >"$log" 2>&1; then
    verdict=ok
  else
    verdict=FAILED
    failed_versions=$((failed_versions + 1))
  fi
  passed=$(grep -Eo '[0-9]+ passed' "$log" | awk '{s += $1} END {print s + 0}')
  failed=$(grep -Eo '[0-9]+ failed' "$log" | awk '{s += $1} END {print s + 0}')
  echo "kueue $version: $verdict, $passed passed, $failed failed, $((SECONDS - start)) s (log: $log)"
  if [[ $verdict == FAILED ]]; then
    grep -E '^test .* FAILED$' "$log" | sed 's/^/  /' || true
  fi
done
unset KUEUE_VERSION
bash "$cp" stop >/dev/null 2>&1 || true
bash "$cp" start >/dev/null
echo "kueue versions: ${#versions[@]} run, $failed_versions failed; $(git rev-parse --short HEAD), $(date -u +%F)"
exit $((failed_versions > 0))
