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
# shellcheck source=tests/e2e-suite.sh
source tests/e2e-suite.sh
read -r -a versions <<<"${KUEUE_VERSIONS:-v0.15.2 v0.19.2}"
threads="${E2E_THREADS:-4}"
out=target/kueue-versions
mkdir -p "$out"
cp=tests/control-plane/control-plane.sh
E2E_HELM="$(bash tests/helm/install-helm.sh)"
export E2E_HELM
cargo test -p e2e -p bench --locked --no-run --quiet

failed_versions=0
for version in "${versions[@]}"; do
  # Exported for the suite too: its harness starts the control plane it finds configured.
  export KUEUE_VERSION="$version"
  bash "$cp" stop >/dev/null 2>&1 || true
  bash "$cp" start >"$out/$version.start.log" 2>&1 ||
    { cat "$out/$version.start.log" >&2; echo "kueue $version: the control plane did not start" >&2; exit 1; }
  run_e2e_suite "kueue $version" "$out/$version.log" --test-threads "$threads" ||
    failed_versions=$((failed_versions + 1))
done
unset KUEUE_VERSION
bash "$cp" stop >/dev/null 2>&1 || true
bash "$cp" start >/dev/null
echo "kueue versions: ${#versions[@]} run, $failed_versions failed; $(git rev-parse --short HEAD), $(date -u +%F)"
exit $((failed_versions > 0))
