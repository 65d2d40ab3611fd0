#!/usr/bin/env bash
# Builds Prometheus' promtool from the Go module proxy into the cache (as install-helm.sh builds
# helm). check-chart.sh uses it to parse every PromQL expression of the alerts and the dashboard
# (`promtool check rules`) and to unit-test the alerts (`promtool test rules`). Idempotent.
# Prints the binary's path.
#
# Settings (environment): PROMETHEUS_MODULE_VERSION (tests/helm/lib.sh), KUEUE_AC_CACHE.
set -euo pipefail
# shellcheck source=tests/helm/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

if [[ -x $PROMTOOL_BIN ]] && "$PROMTOOL_BIN" --version >/dev/null 2>&1; then
  echo "$PROMTOOL_BIN"
  exit 0
fi
# Module v0.X.Y is Prometheus 3.X.Y.
v="${PROMETHEUS_MODULE_VERSION#v0.}"
release="3.$((10#${v%%.*} - 300)).${v#*.}"
hlog "building promtool (Prometheus $release) from github.com/prometheus/prometheus $PROMETHEUS_MODULE_VERSION"
ld="-s -w -X github.com/prometheus/common/version.Version=$release"
ld+=" -X github.com/prometheus/common/version.Branch=release -X github.com/prometheus/common/version.Revision=module"
build_go_tool "$PROMTOOL_BIN" github.com/prometheus/prometheus "$PROMETHEUS_MODULE_VERSION" \
  github.com/prometheus/prometheus/cmd/promtool "$ld"
"$PROMTOOL_BIN" --version >&2 || hdie "the promtool binary just built does not run"
echo "$PROMTOOL_BIN"
