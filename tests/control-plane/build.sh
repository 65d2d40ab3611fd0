#!/usr/bin/env bash
# Builds etcd, kube-apiserver, kube-scheduler, kube-controller-manager, the Kueue controller
# manager and kwok from published Go modules
# into a cache outside the repository, one directory per component and version, so that a
# warm machine skips every step. Nothing here is committed; only this recipe is.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=tests/control-plane/lib.sh
source "$here/lib.sh"

# No DWARF from the compiler and a lazier garbage collector in it (GOGC=400; peak 1.6 GB): a
# cold build of everything took 626 CPU-seconds instead of 727 on 2 cores. Nobody debugs these
# binaries; they run as optimised as before.
export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS="-mod=mod -buildvcs=false -gcflags=all=-dwarf=false" GOGC=400
command -v go >/dev/null || die "go is not installed; the control plane is built from Go modules"

# A wrapper module lets `go build` resolve a main package whose own go.mod carries replace
# directives (kubernetes' staging modules, etcd's sibling modules), which `go install pkg@v` refuses.
wrapper_module() { # dir name
  mkdir -p "$1"
  printf 'module local.build/%s\n\ngo 1.24\n' "$2" >"$1/go.mod"
}

# A line every 30 s while a component builds, so a cold build (minutes, silent once the
# modules are downloaded) never looks hung. One ticker at a time; main's EXIT trap stops it.
progress_pid=""
progress_start() { # what
  progress_stop
  local what=$1 start=$SECONDS
  (while sleep 30; do log "still $what: $((SECONDS - start))s so far (a cold build takes minutes)"; done) &
  progress_pid=$!
}
progress_stop() {
  [[ -n $progress_pid ]] || return 0
  kill "$progress_pid" 2>/dev/null || true
  wait "$progress_pid" 2>/dev/null || true
  progress_pid=""
}

# Builds a component unless its binary OUT is there, saying WHAT it builds meanwhile: BUILD (a
# function) gets a fresh source directory SRC under the cache and the file to write, which is
# moved into place only once complete.
build_component() { # out what src build
  local out=$1 what=$2 src=$3 build=$4
  [[ -x $out ]] && return 0
  log "building $what"
  progress_start "building $what"
  rm -rf "$src"
  "$build" "$src" "$out.tmp"
  mv "$out.tmp" "$out"
}

build_etcd_in() { # module dir, output
  wrapper_module "$1" etcd
  (cd "$1" && go get "go.etcd.io/etcd/server/v3@$ETCD_VERSION" &&
    go build -pgo=off -trimpath -o "$2" go.etcd.io/etcd/server/v3)
}

build_etcd() {
  build_component "$ETCD_BIN" "etcd $ETCD_VERSION" "$CACHE_DIR/src/etcd-$ETCD_VERSION" build_etcd_in
}

# The go.mod of a wrapper module that builds kube-apiserver: it requires k8s.io/kubernetes and
# points each staging module (required at v0.0.0, replaced by a local path in kubernetes' own
# go.mod) at its published version.
write_kubernetes_gomod() { # dir
  local src=$1 gomod
  gomod="$(cd "$src" && go mod download -json "k8s.io/kubernetes@$KUBERNETES_VERSION" | json_field GoMod)"
  [[ -f $gomod ]] || die "could not download k8s.io/kubernetes@$KUBERNETES_VERSION"
  # Staging modules are published as v0.<minor>.<patch> for Kubernetes v1.<minor>.<patch>.
  local staging_version="v0.${KUBERNETES_VERSION#v1.}"
  {
    printf 'module local.build/control-plane\n\n'
    grep -E '^go [0-9]' "$gomod"
    grep -E '^godebug ' "$gomod" || true
    printf '\nrequire k8s.io/kubernetes %s\n\nreplace (\n' "$KUBERNETES_VERSION"
    # The list of staging modules changes between releases: derive it from kubernetes' go.mod.
    sed -nE 's#^[[:space:]]*(k8s\.io/[^[:space:]]+) => \./staging/.*#\1#p' "$gomod" |
      while read -r m; do printf '\t%s => %s %s\n' "$m" "$m" "$staging_version"; done
    printf ')\n'
  } >"$src/go.mod"
}

# The minor of KUBERNETES_VERSION (v1.<minor>.<patch>).
kubernetes_minor() { local minor="${KUBERNETES_VERSION#v1.}"; echo "${minor%%.*}"; }

# Adds Kueue to a wrapper module, seeded with Kueue's go.sum: Kueue's recorded hashes verify
# every dependency it brings in.
add_kueue() { # module dir
  local kdir
  kdir="$(cd "$1" && go mod download -json "sigs.k8s.io/kueue@$KUEUE_VERSION" | json_field Dir)"
  cp "$kdir/go.sum" "$1/go.sum"; chmod u+w "$1/go.sum"
  (cd "$1" && go get "sigs.k8s.io/kueue@$KUEUE_VERSION")
}

# The version stamps of every binary built here: Kubernetes' (an unstamped kube-apiserver
# reports v0.0.0-master, which Kueue cannot parse) and Kueue's; a stamp of a package a binary
# does not link is ignored. `-s -w` leaves out the symbol table and DWARF: links take less time
# and nobody debugs these binaries.
version_ldflags() {
  local ld="-s -w" pkg minor
  minor="$(kubernetes_minor)"
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ld+=" -X $pkg.gitVersion=$KUBERNETES_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
    ld+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
  done
  echo "$ld -X sigs.k8s.io/kueue/pkg/version.GitVersion=$KUEUE_VERSION"
}

# Builds main packages of module dir SRC in one `go build`, each to its binary (arguments
# `package=output`): the packages they share compile once, and their links (single-threaded
# each) run side by side on the cores.
go_build_all() { # module dir, package=output...
  local src=$1 pair pkgs=()
  shift
  for pair in "$@"; do pkgs+=("${pair%%=*}"); done
  rm -rf "${src:?}/bin"; mkdir -p "$src/bin"
  (cd "$src" && go build -pgo=off -trimpath -ldflags "$(version_ldflags)" -o "$src/bin/" "${pkgs[@]}")
  for pair in "$@"; do
    mkdir -p "$(dirname "${pair#*=}")"
    mv "$src/bin/$(basename "${pair%%=*}")" "${pair#*=}"
  done
}

# The Kubernetes minor a Kueue release is built against (its k8s.io/api requirement, v0.<minor>.x).
kueue_kubernetes_minor() {
  local tmp gomod
  tmp="$(mktemp -d)"; wrapper_module "$tmp" probe
  gomod="$(cd "$tmp" && go mod download -json "sigs.k8s.io/kueue@$KUEUE_VERSION" | json_field GoMod)"
  rm -rf "$tmp"
  awk '$1=="k8s.io/api"{split($2, v, "."); print v[2]; exit}' "$gomod"
}

# The Kubernetes components the control plane runs.
KUBERNETES_COMMANDS=(kube-apiserver kube-scheduler kube-controller-manager)
kubernetes_bin() {
  case $1 in
    kube-apiserver) echo "$APISERVER_BIN" ;; kube-scheduler) echo "$SCHEDULER_BIN" ;;
    kube-controller-manager) echo "$CONTROLLER_MANAGER_BIN" ;;
  esac
}

# Adds kwok to a wrapper module, its go.sum merged into the module's: kwok's recorded hashes
# verify what it brings in.
add_kwok() { # module dir
  local dir
  dir="$(cd "$1" && go mod download -json "sigs.k8s.io/kwok@$KWOK_VERSION" | json_field Dir)"
  touch "$1/go.sum"
  sort -u "$1/go.sum" "$dir/go.sum" >"$1/go.sum.merged"
  mv "$1/go.sum.merged" "$1/go.sum"; chmod u+w "$1/go.sum"
  (cd "$1" && go get "sigs.k8s.io/kwok@$KWOK_VERSION")
}

# `go install sigs.k8s.io/kueue/cmd/kueue@v` would do, but it asks the proxy for Kueue's version
# list (a deprecation check) and some proxies refuse that. A wrapper module that starts from
# Kueue's own go.sum verifies every dependency against the hashes Kueue recorded.
build_kueue_in() { # module dir, output
  wrapper_module "$1" kueue
  add_kueue "$1"
  (cd "$1" && go build -pgo=off -trimpath -ldflags "$(version_ldflags)" -o "$2" sigs.k8s.io/kueue/cmd/kueue)
}

build_kueue() {
  build_component "$KUEUE_BIN" "kueue $KUEUE_VERSION" "$CACHE_DIR/src/kueue-$KUEUE_VERSION" build_kueue_in
}

# Kueue imports about 1,100 of kube-apiserver's 1,800 packages (client-go, apiserver, api, ...),
# and the scheduler, the controller manager and kwok most of theirs too. Built in one module and
# one `go build`, each shared package compiles once and the links run side by side: on 2 cores,
# cold, minutes less than apart. Go's version selection then gives every binary the highest of
# their requirements of each dependency (for Kueue v0.19.2 beside Kubernetes v1.36.3:
# k8s.io/client-go v0.36.3 instead of v0.36.2, grpc 1.81.1 instead of 1.79.3 for the apiserver;
# kwok v0.8.0 gets the v0.36.3 k8s.io libraries instead of v0.36.1): patch and minor steps of
# libraries; each binary is still its release's own source. Kueue joins only when built against
# the same Kubernetes minor; an older Kueue (e.g. v0.15, on Kubernetes 1.34) is built alone, with
# exactly its own requirements.
build_kubernetes_kwok_and_kueue() {
  local shared=true missing=() c
  [[ "$(kueue_kubernetes_minor)" == "$(kubernetes_minor)" ]] || shared=false
  for c in "${KUBERNETES_COMMANDS[@]}"; do
    [[ -x $(kubernetes_bin "$c") ]] || missing+=("k8s.io/kubernetes/cmd/$c=$(kubernetes_bin "$c")")
  done
  [[ -x $KWOK_BIN ]] || missing+=("sigs.k8s.io/kwok/cmd/kwok=$KWOK_BIN")
  if $shared && [[ ! -x $KUEUE_BIN ]]; then missing+=("sigs.k8s.io/kueue/cmd/kueue=$KUEUE_BIN"); fi
  if ((${#missing[@]})); then
    local src="$CACHE_DIR/src/control-plane-$KUBERNETES_VERSION-kwok-$KWOK_VERSION"
    $shared && src+="-kueue-$KUEUE_VERSION"
    local what
    what="$(printf '%s\n' "${missing[@]}" | sed 's#=.*##; s#.*/##' | paste -sd' ' -)"
    log "building $what in one module (Kubernetes $KUBERNETES_VERSION, kwok $KWOK_VERSION$($shared && echo ", kueue $KUEUE_VERSION"))"
    rm -rf "$src"; mkdir -p "$src"
    write_kubernetes_gomod "$src"
    if $shared; then add_kueue "$src"; fi
    add_kwok "$src"
    progress_start "building $what"
    go_build_all "$src" "${missing[@]}"
  fi
  $shared || build_kueue
}

# Manifests come from the same modules: Kueue's CRDs and webhooks, and the ProvisioningRequest CRD
# at the autoscaler API version that this Kueue release pins.
fetch_manifests() {
  local dst="$MANIFEST_DIR"
  [[ -f $dst/.complete-v4 ]] && return 0
  log "collecting manifests for kueue $KUEUE_VERSION"
  rm -rf "$dst"; mkdir -p "$dst/crds"
  local tmp kdir kgomod asv adir
  tmp="$(mktemp -d)"; wrapper_module "$tmp" manifests
  kdir="$(cd "$tmp" && go mod download -json "sigs.k8s.io/kueue@$KUEUE_VERSION" | json_field Dir)"
  kgomod="$(cd "$tmp" && go mod download -json "sigs.k8s.io/kueue@$KUEUE_VERSION" | json_field GoMod)"
  cp "$kdir"/config/components/crd/bases/kueue.x-k8s.io_*.yaml "$dst/crds/"
  # Which CRDs get Kueue's conversion webhook is said by the kustomization next to the CRDs
  # (only the patches it lists: some patch files are present but not used).
  mkdir -p "$dst/crd-kustomization"
  cp -r "$kdir/config/components/crd/kustomization.yaml" "$kdir/config/components/crd/patches" \
    "$dst/crd-kustomization/"
  cp "$kdir/config/components/webhook/manifests.yaml" "$dst/webhooks.yaml"
  # The release's own manager configuration: the control plane runs Kueue with its reconcile
  # concurrency, as a deployment from the release manifests would.
  cp "$kdir/config/components/manager/controller_manager_config.yaml" "$dst/manager-config.yaml"
  asv="$(awk '$1=="k8s.io/autoscaler/cluster-autoscaler/apis"{print $2; exit}' "$kgomod")"
  [[ -n $asv ]] || die "kueue $KUEUE_VERSION does not pin k8s.io/autoscaler/cluster-autoscaler/apis"
  adir="$(cd "$tmp" && go mod download -json "k8s.io/autoscaler/cluster-autoscaler/apis@$asv" | json_field Dir)"
  cp "$adir/config/crd/autoscaling.x-k8s.io_provisioningrequests.yaml" "$dst/crds/"
  chmod -R u+w "$dst"; rm -rf "$tmp"
  touch "$dst/.complete-v4"
}

# Karpenter's kwok build (package sigs.k8s.io/karpenter/kwok, in Karpenter's own module) in a
# wrapper module of its own, seeded with Karpenter's go.sum: it is built against its own
# Kubernetes libraries, which need not be the control plane's.
build_karpenter_in() { # module dir, output
  wrapper_module "$1" karpenter
  local kdir
  kdir="$(cd "$1" && go mod download -json "sigs.k8s.io/karpenter@$KARPENTER_VERSION" | json_field Dir)"
  [[ -d $kdir/kwok ]] || die "sigs.k8s.io/karpenter@$KARPENTER_VERSION has no kwok provider"
  cp "$kdir/go.sum" "$1/go.sum"; chmod u+w "$1/go.sum"
  # go get raises the wrapper's go line to Karpenter's.
  (cd "$1" && go get "sigs.k8s.io/karpenter@$KARPENTER_VERSION" &&
    go build -pgo=off -trimpath -ldflags "-s -w" -o "$2" sigs.k8s.io/karpenter/kwok)
}

# Karpenter's CRDs (NodePool, NodeClaim, NodeOverlay, CapacityBuffer, and the kwok provider's
# KWOKNodeClass) from the same module; none has a conversion webhook, which the empty
# kustomization beside them says to `kube.py apply-crds`.
fetch_karpenter_manifests() {
  local dst="$KARPENTER_MANIFEST_DIR" tmp kdir f
  [[ -f $dst/.complete-v1 ]] && return 0
  log "collecting Karpenter $KARPENTER_VERSION's CRDs"
  rm -rf "$dst"; mkdir -p "$dst/crds"
  tmp="$(mktemp -d)"; wrapper_module "$tmp" manifests
  kdir="$(cd "$tmp" && go mod download -json "sigs.k8s.io/karpenter@$KARPENTER_VERSION" | json_field Dir)"
  for f in karpenter.sh_nodepools karpenter.sh_nodeclaims karpenter.sh_nodeoverlays \
    autoscaling.x-k8s.io_capacitybuffers; do
    [[ -f $kdir/pkg/apis/crds/$f.yaml ]] || die "Karpenter $KARPENTER_VERSION has no CRD $f"
    cp "$kdir/pkg/apis/crds/$f.yaml" "$dst/crds/"
  done
  f=kwok/apis/crds/karpenter.kwok.sh_kwoknodeclasses.yaml
  [[ -f $kdir/$f ]] || die "Karpenter $KARPENTER_VERSION has no $f"
  cp "$kdir/$f" "$dst/crds/"
  printf '{}\n' >"$dst/kustomization.yaml"
  chmod -R u+w "$dst"; rm -rf "$tmp"
  touch "$dst/.complete-v1"
}

build_karpenter() {
  fetch_karpenter_manifests
  build_component "$KARPENTER_BIN" "karpenter $KARPENTER_VERSION (kwok provider)" \
    "$CACHE_DIR/src/karpenter-$KARPENTER_VERSION" build_karpenter_in
  progress_stop
}

main() {
  trap progress_stop EXIT
  if [[ ${1:-} == karpenter ]]; then
    mkdir -p "$BIN_DIR"
    local start=$SECONDS
    build_karpenter
    log "karpenter $KARPENTER_VERSION ready in $((SECONDS - start))s: $KARPENTER_BIN"
    return 0
  fi
  mkdir -p "$BIN_DIR"
  local start=$SECONDS
  # etcd (and the manifests, mostly downloads) beside the big module: each leaves a core idle
  # at times (downloads, a single-threaded link), which the other fills.
  (
    trap progress_stop EXIT
    fetch_manifests
    build_etcd
  ) &
  local beside=$!
  build_kubernetes_kwok_and_kueue
  wait "$beside" || die "building etcd or collecting the manifests failed (output above)"
  progress_stop
  log "control plane binaries ready in $((SECONDS - start))s under $BIN_DIR"
}
main "$@"
