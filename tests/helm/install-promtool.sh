#!/usr/bin/env bash
# Provides Prometheus' promtool in the cache: Debian's, unpacked from its package, where apt
# serves it; else built from the Go module proxy (as install-helm.sh builds helm).
# check-chart.sh uses it to parse every PromQL expression of the alerts and the dashboard
# (`promtool check rules`) and to unit-test the alerts (`promtool test rules`). Idempotent.
# Prints the binary's path.
#
# Settings (environment): PROMTOOL_FROM=go, PROMETHEUS_MODULE_VERSION (tests/helm/lib.sh),
# KUEUE_AC_CACHE.
set -euo pipefail
# shellcheck source=tests/helm/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

if [[ -x $PROMTOOL_BIN ]] && "$PROMTOOL_BIN" --version >/dev/null 2>&1; then
  echo "$PROMTOOL_BIN"
  exit 0
fi
# Debian ships promtool in its prometheus package. Downloaded and unpacked (not installed: no
# server, no service, no dependencies), it spares a cold machine a 10-minute Go build. Its
# Prometheus 2.42 parses every expression and passes every alert unit test of the charts, so the
# alerts also work on a Prometheus 2. PROMTOOL_FROM=go builds the newer one instead.
if [[ ${PROMTOOL_FROM:-} != go ]]; then
  if [[ -x $DEBIAN_PROMTOOL_BIN ]] && "$DEBIAN_PROMTOOL_BIN" --version >/dev/null 2>&1; then
    echo "$DEBIAN_PROMTOOL_BIN"
    exit 0
  fi
  if command -v apt-get >/dev/null && command -v dpkg-deb >/dev/null; then
    deb="$(mktemp -d)"
    if (cd "$deb" && apt-get download prometheus >/dev/null 2>&1) &&
      dpkg-deb -x "$deb"/prometheus_*.deb "$deb/root" &&
      "$deb/root/usr/bin/promtool" --version >/dev/null 2>&1; then
      install -D -m 0755 "$deb/root/usr/bin/promtool" "$DEBIAN_PROMTOOL_BIN"
      rm -rf "$deb"
      hlog "promtool from Debian's prometheus package: $("$DEBIAN_PROMTOOL_BIN" --version 2>&1 | head -n1)"
      echo "$DEBIAN_PROMTOOL_BIN"
      exit 0
    fi
    rm -rf "$deb"
    hlog "Debian's prometheus package could not be downloaded; building promtool from Go modules"
  fi
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
