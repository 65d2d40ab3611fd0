# shellcheck shell=bash disable=SC2034
# Shared by the chart scripts (sourced, not run): tool versions, and building a Go tool from the
# module proxy into the cache the control plane uses, the way tests/control-plane/build.sh does.
# shellcheck source=tests/control-plane/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../control-plane/lib.sh"

# The one place to bump them; each can be overridden from the environment.
HELM_VERSION="${HELM_VERSION:-v3.22.0}"
# Prometheus v3.15.0 is published as the Go module github.com/prometheus/prometheus v0.315.0.
PROMETHEUS_MODULE_VERSION="${PROMETHEUS_MODULE_VERSION:-v0.315.0}"
# Its CRDs (ServiceMonitor, PrometheusRule) validate what the chart renders.
PROMETHEUS_OPERATOR_VERSION="${PROMETHEUS_OPERATOR_VERSION:-v0.85.0}"

HELM_BIN="$(tool_bin helm "$HELM_VERSION")"
PROMTOOL_BIN="$(tool_bin promtool "$PROMETHEUS_MODULE_VERSION")"
# Debian's promtool, unpacked from its prometheus package (PROMTOOL_FROM=go skips it).
DEBIAN_PROMTOOL_BIN="$(tool_bin promtool debian)"

hlog() { tagged_log chart "$@"; }
hdie() { tagged_die chart "$@"; }

# The directory of a downloaded module (downloading it if needed).
module_dir() { # module version
  local tmp dir
  tmp="$(mktemp -d)"
  printf 'module local.build/download\n\ngo 1.24\n' >"$tmp/go.mod"
  dir="$(cd "$tmp" && go mod download -json "$1@$2" | json_field Dir)" || { rm -rf "$tmp"; return 1; }
  rm -rf "$tmp"
  echo "$dir"
}

# Builds PACKAGE of MODULE@VERSION into OUT. `go install pkg@version` asks the proxy for the
# module's version list, which some proxies refuse; a wrapper module seeded with the module's own
# go.sum builds the same binary and verifies every dependency against the hashes it recorded.
build_go_tool() { # out module version package ldflags
  local out=$1 module=$2 version=$3 package=$4 ldflags=$5 src mdir start=$SECONDS
  command -v go >/dev/null || hdie "go is required to build $package"
  export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS="-mod=mod -buildvcs=false"
  src="$CACHE_DIR/src/$(basename "$(dirname "$out")")"
  rm -rf "$src"; mkdir -p "$src" "$(dirname "$out")"
  printf 'module local.build/%s\n\ngo 1.24\n' "$(basename "$out")" >"$src/go.mod"
  mdir="$(module_dir "$module" "$version")" || hdie "could not download $module@$version"
  cp "$mdir/go.sum" "$src/go.sum"; chmod u+w "$src/go.sum"
  # Quiet unless it fails: a cold build downloads hundreds of modules.
  if ! (cd "$src" && go get "$module@$version" &&
    go build -pgo=off -trimpath -ldflags "$ldflags" -o "$out.tmp" "$package") >"$src/build.log" 2>&1; then
    tail -n 40 "$src/build.log" >&2
    hdie "building $package failed; the whole log: $src/build.log"
  fi
  mv "$out.tmp" "$out"
  hlog "built $package ($module $version) in $((SECONDS - start))s: $out"
}
