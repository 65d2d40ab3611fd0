#!/usr/bin/env bash
# Builds helm v3 from the Go module proxy into the cache, the way tests/control-plane/build.sh
# builds the control plane (no release download: only the module proxy is reachable).
# Idempotent: a cached binary of the pinned version is reused. Prints the binary's path.
#
#   tests/helm/install-helm.sh     e.g. ~/.cache/kueue-admission-checks/bin/helm-v3.22.0/helm
#
# Settings (environment): HELM_VERSION (tests/helm/lib.sh), KUEUE_AC_CACHE (cache root).
set -euo pipefail
# shellcheck source=tests/helm/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

if [[ -x $HELM_BIN ]] && "$HELM_BIN" version --short 2>/dev/null | grep -qxF "$HELM_VERSION"; then
  echo "$HELM_BIN"
  exit 0
fi
hlog "building helm $HELM_VERSION from helm.sh/helm/v3 (Go module proxy)"
mdir="$(module_dir helm.sh/helm/v3 "$HELM_VERSION")" || hdie "could not download helm.sh/helm/v3@$HELM_VERSION"
# The ldflags of helm's Makefile: the version, and the Kubernetes version `helm template` and
# `helm lint` assume by default (client-go v0.N → Kubernetes 1.N) instead of the 1.20 fallback.
client_go="$(awk '$1=="k8s.io/client-go"{print $2; exit}' "$mdir/go.mod")"
[[ $client_go =~ ^v0\.([0-9]+)\. ]] || hdie "cannot read helm's k8s.io/client-go version from its go.mod"
ld="-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION"
ld+=" -X helm.sh/helm/v3/internal/version.gitTreeState=clean"
for pkg in helm.sh/helm/v3/pkg/lint/rules helm.sh/helm/v3/pkg/chartutil; do
  ld+=" -X $pkg.k8sVersionMajor=1 -X $pkg.k8sVersionMinor=${BASH_REMATCH[1]}"
done
build_go_tool "$HELM_BIN" helm.sh/helm/v3 "$HELM_VERSION" helm.sh/helm/v3/cmd/helm "$ld"
"$HELM_BIN" version --short >&2 || hdie "the helm binary just built does not run"
echo "$HELM_BIN"
