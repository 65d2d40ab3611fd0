# shellcheck shell=bash disable=SC2034
# Shared settings of the control-plane scripts (sourced, not run; the variables are used there).
# shellcheck source=tests/control-plane/versions.env
source "$(dirname "${BASH_SOURCE[0]}")/versions.env"

# Built binaries and manifests live outside the repository, keyed by version.
CACHE_DIR="${KUEUE_AC_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/kueue-admission-checks}"
BIN_DIR="$CACHE_DIR/bin"
MANIFEST_DIR="$CACHE_DIR/manifests/kueue-$KUEUE_VERSION"
# Where a built tool lives: a directory per tool and version, so that bumping a version
# builds the new one beside the old; the executable is named after the tool.
tool_bin() { printf '%s/%s-%s/%s\n' "$BIN_DIR" "$1" "$2" "$1"; } # tool version
ETCD_BIN="$(tool_bin etcd "$ETCD_VERSION")"
APISERVER_BIN="$(tool_bin kube-apiserver "$KUBERNETES_VERSION")"
KUEUE_BIN="$(tool_bin kueue "$KUEUE_VERSION")"
SCHEDULER_BIN="$(tool_bin kube-scheduler "$KUBERNETES_VERSION")"
CONTROLLER_MANAGER_BIN="$(tool_bin kube-controller-manager "$KUBERNETES_VERSION")"
KWOK_BIN="$(tool_bin kwok "$KWOK_VERSION")"
KARPENTER_BIN="$(tool_bin karpenter "$KARPENTER_VERSION")"
KARPENTER_MANIFEST_DIR="$CACHE_DIR/manifests/karpenter-$KARPENTER_VERSION"

# A message on stderr under a [tag], and the same as an error that ends the script; the chart
# scripts, which source this file, log under their own tag.
tagged_log() { local tag=$1; shift; printf '[%s] %s\n' "$tag" "$*" >&2; }
tagged_die() { local tag=$1; shift; printf '[%s] error: %s\n' "$tag" "$*" >&2; exit 1; }
log() { tagged_log control-plane "$@"; }
die() { tagged_die control-plane "$@"; }

# Reads one top-level string field of a JSON object on stdin (go mod download -json output).
json_field() { python3 -c 'import json,sys; print(json.load(sys.stdin)[sys.argv[1]])' "$1"; }
