#!/usr/bin/env bash
# The local control plane for tests and the demo, on loopback: real etcd, kube-apiserver,
# kube-controller-manager (Job controller, garbage collector, node lifecycle), kube-scheduler,
# Kueue, and kwok playing the kubelets of fake nodes (one standing node, kwok-standing-1).
#
#   control-plane.sh start              build if needed, start everything, wait until ready (idempotent)
#   control-plane.sh stop               stop the processes this script started (by pid)
#   control-plane.sh status             what runs, and whether it answers
#   control-plane.sh restart COMPONENT  stop and start one component (not etcd) on the same data
#   control-plane.sh env                shell exports for KUBECONFIG and the run directory
#   control-plane.sh kubeconfig-for NAMESPACE SERVICEACCOUNT [SECONDS]
#                                       a kubeconfig authenticating as that ServiceAccount (RBAC applies)
#   control-plane.sh build              only build the binaries into the cache
#   control-plane.sh start-karpenter    also run Karpenter (kwok provider, CapacityBuffer gate on)
#                                       on the running control plane; built on first use
#   control-plane.sh stop-karpenter     stop only Karpenter (stop stops it too)
#
# Settings (environment): versions in versions.env; KUEUE_AC_CACHE (cache root), KUEUE_AC_RUN_DIR
# (pids, logs, certificates, kubeconfigs), CP_*_PORT (ports below); KUEUE_CLIENT_QPS and
# KUEUE_CLIENT_BURST, Kueue's client limit (300 and 500 as Kueue ships; a negative QPS turns
# Kueue's client limiter off), read by start and by restart kueue.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=tests/control-plane/lib.sh
source "$here/lib.sh"

RUN_DIR="${KUEUE_AC_RUN_DIR:-$CACHE_DIR/run}"
PKI="$RUN_DIR/pki"
LOGS="$RUN_DIR/logs"
PIDS="$RUN_DIR/pids"
ETCD_PORT="${CP_ETCD_PORT:-23790}"
ETCD_PEER_PORT="${CP_ETCD_PEER_PORT:-23800}"
APISERVER_PORT="${CP_APISERVER_PORT:-16443}"
KUEUE_WEBHOOK_PORT="${CP_KUEUE_WEBHOOK_PORT:-19443}"
KUEUE_HEALTH_PORT="${CP_KUEUE_HEALTH_PORT:-18081}"
KUEUE_METRICS_PORT="${CP_KUEUE_METRICS_PORT:-18443}"
CONTROLLER_MANAGER_PORT="${CP_CONTROLLER_MANAGER_PORT:-20257}"
SCHEDULER_PORT="${CP_SCHEDULER_PORT:-20259}"
KWOK_PORT="${CP_KWOK_PORT:-20247}"
KARPENTER_METRICS_PORT="${CP_KARPENTER_METRICS_PORT:-20280}"
KARPENTER_HEALTH_PORT="${CP_KARPENTER_HEALTH_PORT:-20281}"
# Every gate of Karpenter v1.14 said explicitly (one given with no value stops it at start),
# CapacityBuffer (alpha, off by default) on.
KARPENTER_FEATURE_GATES="${KARPENTER_FEATURE_GATES:-NodeRepair=false,ReservedCapacity=true,SpotToSpotConsolidation=false,NodeOverlay=false,StaticCapacity=false,CapacityBuffer=true}"
SERVER="https://127.0.0.1:$APISERVER_PORT"
KUBECONFIG_PATH="$RUN_DIR/admin.kubeconfig"
# The users Kueue and the autoscaler simulator authenticate as (audited; see the audit policy).
KUEUE_USER=kueue-controller-manager
SIMULATOR_USER=autoscaler-simulator
# Kueue's client limit (cmd/kueue/main.go: a negative QPS sets no limiter at all).
KUEUE_CLIENT_QPS="${KUEUE_CLIENT_QPS:-300}"
KUEUE_CLIENT_BURST="${KUEUE_CLIENT_BURST:-500}"
[[ $KUEUE_CLIENT_QPS =~ ^-?[0-9]+(\.[0-9]+)?$ ]] || die "KUEUE_CLIENT_QPS=$KUEUE_CLIENT_QPS is not a number"
[[ $KUEUE_CLIENT_BURST =~ ^[0-9]+$ ]] || die "KUEUE_CLIENT_BURST=$KUEUE_CLIENT_BURST is not a whole number"
# Kueue v0.15+ reads its metrics serving certificate from this fixed path when it does not
# manage certificates itself (cmd/kueue/main.go); there is no setting to move it.
KUEUE_METRICS_CERT_DIR=/etc/kueue/metrics/certs
# In start order; stopped in reverse (Kueue first, etcd last).
COMPONENTS=(etcd kube-apiserver kube-controller-manager kube-scheduler kwok kueue)
# What kube-controller-manager runs: what a Job, its pods and the objects they own need, and
# the namespace controller, which empties and removes a deleted namespace as in any cluster
# (the benchmarks wait until an earlier run's namespaces are gone before they measure).
CONTROLLERS=job-controller,garbage-collector-controller,node-lifecycle-controller,pod-garbage-collector-controller,taint-eviction-controller,namespace-controller
# kwok manages only nodes carrying this annotation (the standing node, and the nodes an
# autoscaler creates from templates that carry it).
KWOK_NODE_ANNOTATION=kwok.x-k8s.io/node=fake

export CP_PKI_DIR="$PKI" CP_SERVER="$SERVER"
kube() { python3 "$here/kube.py" "$@"; }

# --- processes ---------------------------------------------------------------------------------

binary_of() {
  case $1 in
    etcd) echo "$ETCD_BIN" ;; kube-apiserver) echo "$APISERVER_BIN" ;; kueue) echo "$KUEUE_BIN" ;;
    kube-controller-manager) echo "$CONTROLLER_MANAGER_BIN" ;; kube-scheduler) echo "$SCHEDULER_BIN" ;;
    kwok) echo "$KWOK_BIN" ;; karpenter) echo "$KARPENTER_BIN" ;;
  esac
}

# A pid file holds "PID EXECUTABLE". The pid counts only while that process is alive and still
# runs the recorded executable: a recycled pid is never signalled.
live_pid() {
  local f="$PIDS/$1.pid" pid recorded exe
  [[ -f $f ]] || return 1
  read -r pid recorded <"$f" || true
  exe="$(readlink "/proc/$pid/exe" 2>/dev/null)" || return 1
  [[ ${exe% (deleted)} == "$recorded" ]] || return 1
  echo "$pid"
}

# Alive and running the binary of the versions configured now (not, e.g., an older Kueue).
runs_configured_version() {
  live_pid "$1" >/dev/null && [[ $(cut -d' ' -f2- "$PIDS/$1.pid") == "$(binary_of "$1")" ]]
}

spawn() { # name args...
  local name=$1 bin; shift
  bin="$(binary_of "$name")"
  mkdir -p "$LOGS" "$PIDS"
  # 9>&-: the daemon must not inherit the start/stop lock, or it would hold it for its lifetime.
  setsid "$bin" "$@" >>"$LOGS/$name.log" 2>&1 </dev/null 9>&- &
  local pid=$! exe i
  echo "$pid $bin" >"$PIDS/$name.pid"
  # The child runs bash, then setsid, before it execs the component: until then live_pid would
  # call a component that is starting dead (seen right after spawn about one time in five, and
  # once in CI on a loaded machine, as "exited during start-up" with an empty log).
  for ((i = 0; i < 200; i++)); do
    exe="$(readlink "/proc/$pid/exe" 2>/dev/null)" || return 0 # gone: wait_for reports it
    [[ ${exe% (deleted)} == "$bin" ]] && return 0
    sleep 0.05
  done
  log "$name (pid $pid) still runs $exe after 10s; its start-up check will fail"
}

stop_component() {
  local name=$1 pid i
  if pid="$(live_pid "$name")"; then
    kill -TERM "$pid" 2>/dev/null || true
    for ((i = 0; i < 100; i++)); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    if kill -0 "$pid" 2>/dev/null; then
      log "$name (pid $pid) ignored SIGTERM for 10s, killing it"
      kill -KILL "$pid" 2>/dev/null || true
    fi
    log "stopped $name (pid $pid)"
  fi
  rm -f "$PIDS/$name.pid"
}

# Waits until a command succeeds; on timeout shows the component's log tail and fails.
wait_for() { # name seconds command...
  local name=$1 seconds=$2 deadline; shift 2
  deadline=$((SECONDS + seconds))
  until "$@" >/dev/null 2>&1; do
    if ! live_pid "$name" >/dev/null; then
      tail -n 40 "$LOGS/$name.log" >&2 || true
      die "$name exited during start-up; its log: $LOGS/$name.log"
    fi
    if ((SECONDS >= deadline)); then
      tail -n 40 "$LOGS/$name.log" >&2 || true
      die "$name not ready after ${seconds}s; its log: $LOGS/$name.log"
    fi
    sleep 0.2
  done
}

curl_admin() { curl -sf --cacert "$PKI/ca.crt" --cert "$PKI/admin.crt" --key "$PKI/admin.key" "$@"; }
etcd_healthy() { curl -sf "http://127.0.0.1:$ETCD_PORT/health" | grep -q '"health":"true"'; }
apiserver_ready() { [[ $(curl_admin "$SERVER/readyz") == ok ]]; }
kueue_ready() { curl -sf "http://127.0.0.1:$KUEUE_HEALTH_PORT/readyz" >/dev/null; }
# Both serve /healthz without authentication (always-allowed path), over TLS with a
# self-signed certificate of their own.
controller_manager_ready() { [[ $(curl -sk "https://127.0.0.1:$CONTROLLER_MANAGER_PORT/healthz") == ok ]]; }
scheduler_ready() { [[ $(curl -sk "https://127.0.0.1:$SCHEDULER_PORT/healthz") == ok ]]; }
kwok_ready() { [[ $(curl -s "http://127.0.0.1:$KWOK_PORT/healthz") == ok ]]; }
karpenter_ready() { curl -sf "http://127.0.0.1:$KARPENTER_HEALTH_PORT/readyz" >/dev/null; }
# Whether a running component answers its health check.
component_ready() {
  case $1 in
    etcd) etcd_healthy ;; kube-apiserver) apiserver_ready ;; kueue) kueue_ready ;;
    kube-controller-manager) controller_manager_ready ;; kube-scheduler) scheduler_ready ;;
    kwok) kwok_ready ;; karpenter) karpenter_ready ;;
  esac
}

# --- certificates and configuration ------------------------------------------------------------

make_pki() {
  [[ -f $PKI/.complete-v3 ]] && return 0
  command -v openssl >/dev/null || die "openssl is required to make the control plane's certificates"
  rm -rf "$PKI"; mkdir -p "$PKI"
  (
    cd "$PKI"
    key() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1" 2>/dev/null; }
    key ca.key
    openssl req -x509 -new -key ca.key -subj "/CN=kueue-ac-local-ca" -days 3650 -out ca.crt
    sign() { # name subject extensions
      key "$1.key"
      openssl req -new -key "$1.key" -subj "$2" -out "$1.csr"
      printf '%s\n' "$3" >"$1.ext"
      openssl x509 -req -in "$1.csr" -CA ca.crt -CAkey ca.key -CAcreateserial -days 3650 \
        -extfile "$1.ext" -out "$1.crt" 2>/dev/null
      rm -f "$1.csr" "$1.ext"
    }
    local serving="subjectAltName=IP:127.0.0.1,DNS:localhost
extendedKeyUsage=serverAuth
keyUsage=critical,digitalSignature,keyEncipherment"
    sign apiserver "/CN=kube-apiserver" "$serving"
    sign kueue-webhook "/CN=kueue-webhook" "$serving"
    local client="extendedKeyUsage=clientAuth
keyUsage=critical,digitalSignature,keyEncipherment"
    sign admin "/O=system:masters/CN=kueue-ac-admin" "$client"
    # Kueue and the autoscaler simulator each have a user of their own, so the audit log tells
    # their requests apart from the tests' (the comparison benchmark counts them per actor).
    sign kueue "/O=system:masters/CN=$KUEUE_USER" "$client"
    sign autoscaler-simulator "/O=system:masters/CN=$SIMULATOR_USER" "$client"
    # The cluster's own components, each under its usual user name, so the API server's and
    # their logs tell them apart.
    sign kube-controller-manager "/O=system:masters/CN=system:kube-controller-manager" "$client"
    sign kube-scheduler "/O=system:masters/CN=system:kube-scheduler" "$client"
    sign kwok "/O=system:masters/CN=kwok-controller" "$client"
    # ServiceAccount token signing key (RSA: the apiserver's issuer uses RS256).
    openssl genpkey -algorithm RSA -pkeyopt rsa_keygen_bits:2048 -out sa.key 2>/dev/null
    openssl pkey -in sa.key -pubout -out sa.pub
    mkdir -p kueue-webhook-certs
    cp kueue-webhook.crt kueue-webhook-certs/tls.crt
    cp kueue-webhook.key kueue-webhook-certs/tls.key
  )
  touch "$PKI/.complete-v3"
}

write_kubeconfig() { # path user-block
  local b64ca
  b64ca="$(base64 -w0 <"$PKI/ca.crt")"
  cat >"$1.tmp" <<KCFG
apiVersion: v1
kind: Config
clusters:
- name: kueue-ac-local
  cluster:
    server: $SERVER
    certificate-authority-data: $b64ca
contexts:
- name: kueue-ac-local
  context: {cluster: kueue-ac-local, user: user}
current-context: kueue-ac-local
users:
- name: user
  user:
$2
KCFG
  chmod 600 "$1.tmp"; mv "$1.tmp" "$1"
}

write_client_kubeconfig() { # path certificate-name
  write_kubeconfig "$1" "    client-certificate-data: $(base64 -w0 <"$PKI/$2.crt")
    client-key-data: $(base64 -w0 <"$PKI/$2.key")"
}

write_kubeconfigs() {
  write_client_kubeconfig "$KUBECONFIG_PATH" admin
  write_client_kubeconfig "$RUN_DIR/kueue.kubeconfig" kueue
  write_client_kubeconfig "$RUN_DIR/autoscaler-simulator.kubeconfig" autoscaler-simulator
  local c
  for c in kube-controller-manager kube-scheduler kwok; do write_client_kubeconfig "$RUN_DIR/$c.kubeconfig" "$c"; done
}

install_metrics_certs() {
  cmp -s "$PKI/kueue-webhook.crt" "$KUEUE_METRICS_CERT_DIR/tls.crt" 2>/dev/null && return 0
  if ! { mkdir -p "$KUEUE_METRICS_CERT_DIR" && cp "$PKI/kueue-webhook.crt" "$KUEUE_METRICS_CERT_DIR/tls.crt" &&
    cp "$PKI/kueue-webhook.key" "$KUEUE_METRICS_CERT_DIR/tls.key"; } 2>/dev/null; then
    die "Kueue reads its metrics certificate from $KUEUE_METRICS_CERT_DIR, which this user cannot write; create it (tls.crt, tls.key) or run as root"
  fi
}

write_kueue_config() {
  cat >"$RUN_DIR/kueue-config.yaml" <<KCFG
apiVersion: config.kueue.x-k8s.io/v1beta2
kind: Configuration
namespace: kueue-system
health:
  healthProbeBindAddress: 127.0.0.1:$KUEUE_HEALTH_PORT
metrics:
  bindAddress: 127.0.0.1:$KUEUE_METRICS_PORT
webhook:
  host: 127.0.0.1
  port: $KUEUE_WEBHOOK_PORT
  certDir: $PKI/kueue-webhook-certs
leaderElection:
  leaderElect: false
internalCertManagement:
  enable: false
clientConnection:
  qps: $KUEUE_CLIENT_QPS
  burst: $KUEUE_CLIENT_BURST
integrations:
  frameworks:
  - batch/job
featureGates:
  # On-demand visibility serves an API of its own that needs certificates under /visibility.
  VisibilityOnDemand: false
KCFG
  # The release's reconcile concurrency (groupKindConcurrency), as shipped: without it each
  # of Kueue's controllers reconciles one object at a time.
  python3 - "$MANIFEST_DIR/manager-config.yaml" >>"$RUN_DIR/kueue-config.yaml" <<'PY'
import sys, yaml
shipped = yaml.safe_load(open(sys.argv[1]))
concurrency = (shipped.get("controller") or {}).get("groupKindConcurrency")
if not concurrency:
    sys.exit(f"{sys.argv[1]} has no controller.groupKindConcurrency")
print(yaml.safe_dump({"controller": {"groupKindConcurrency": concurrency}}), end="")
PY
}

# --- commands ----------------------------------------------------------------------------------

# Something else listening on one of our ports would make a component fail obscurely (or, worse,
# make a health check pass against the wrong process): refuse to start instead.
check_ports_free() {
  local entry name port var
  for entry in "etcd:$ETCD_PORT:CP_ETCD_PORT" "etcd-peer:$ETCD_PEER_PORT:CP_ETCD_PEER_PORT" \
    "kube-apiserver:$APISERVER_PORT:CP_APISERVER_PORT" "kueue-webhook:$KUEUE_WEBHOOK_PORT:CP_KUEUE_WEBHOOK_PORT" \
    "kueue-health:$KUEUE_HEALTH_PORT:CP_KUEUE_HEALTH_PORT" "kueue-metrics:$KUEUE_METRICS_PORT:CP_KUEUE_METRICS_PORT" \
    "kube-controller-manager:$CONTROLLER_MANAGER_PORT:CP_CONTROLLER_MANAGER_PORT" \
    "kube-scheduler:$SCHEDULER_PORT:CP_SCHEDULER_PORT" "kwok:$KWOK_PORT:CP_KWOK_PORT"; do
    IFS=: read -r name port var <<<"$entry"
    if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
      die "port $port ($name) is already in use by a process this script did not start; free it or set $var"
    fi
  done
}

all_running() { local c; for c in "${COMPONENTS[@]}"; do runs_configured_version "$c" || return 1; done; }
all_ready() { local c; for c in "${COMPONENTS[@]}"; do component_ready "$c" || return 1; done; }

cmd_start() {
  command -v curl >/dev/null || die "curl is required"
  python3 -c 'import yaml' 2>/dev/null || die "python3 with PyYAML is required (Debian: python3-yaml)"
  # A control plane started by another version of these scripts (another Kueue config, other
  # users) is started again.
  local stamp
  stamp="$(cat "$here/control-plane.sh" "$here/lib.sh" "$here/versions.env" "$here/kwok-stages.yaml" "$here/standing-node.yaml" |
    sha256sum | cut -c1-16)"
  if all_running && [[ $(cat "$RUN_DIR/started-by" 2>/dev/null) == "$stamp" ]] && all_ready; then
    log "already running (KUBECONFIG=$KUBECONFIG_PATH)"
    return 0
  fi
  bash "$here/build.sh"
  local start=$SECONDS
  # A half-running control plane (e.g. one process crashed), or one of other versions, is
  # restarted whole, on fresh etcd data, so every start gives the same clean cluster.
  cmd_stop >/dev/null 2>&1 || true
  check_ports_free
  mkdir -p "$RUN_DIR" "$LOGS" "$PIDS"
  local c
  for c in "${COMPONENTS[@]}" audit; do : >"$LOGS/$c.log"; done
  # Requests of ServiceAccounts (the controllers under test run as theirs), Kueue and the
  # simulator, at Metadata level: who asked for what and the response code. The RBAC proofs
  # read the 403s from it; the comparison benchmark counts requests per actor.
  cat >"$RUN_DIR/audit-policy.yaml" <<AUDIT
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived"]
rules:
  - level: Metadata
    userGroups: ["system:serviceaccounts"]
  - level: Metadata
    users: ["$KUEUE_USER", "$SIMULATOR_USER"]
  - level: None
AUDIT
  make_pki
  rm -rf "$RUN_DIR/etcd-data"

  spawn etcd --name local --data-dir "$RUN_DIR/etcd-data" \
    --listen-client-urls "http://127.0.0.1:$ETCD_PORT" --advertise-client-urls "http://127.0.0.1:$ETCD_PORT" \
    --listen-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" \
    --initial-advertise-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" \
    --initial-cluster "local=http://127.0.0.1:$ETCD_PEER_PORT" \
    --unsafe-no-fsync --quota-backend-bytes 4294967296
  wait_for etcd 30 etcd_healthy

  start_apiserver
  write_kubeconfigs

  kube apply-crds "https://127.0.0.1:$KUEUE_WEBHOOK_PORT/convert" "$PKI/ca.crt" \
    "$MANIFEST_DIR/crd-kustomization" "$MANIFEST_DIR"/crds/*.yaml
  kube render-webhooks "$MANIFEST_DIR/webhooks.yaml" "https://127.0.0.1:$KUEUE_WEBHOOK_PORT" \
    "$PKI/ca.crt" "kueue.x-k8s.io,batch" >"$RUN_DIR/webhooks.yaml"
  kube apply "$RUN_DIR/webhooks.yaml"
  printf 'apiVersion: v1\nkind: Namespace\nmetadata: {name: kueue-system}\n' >"$RUN_DIR/kueue-namespace.yaml"
  kube apply "$RUN_DIR/kueue-namespace.yaml"

  start_controller_manager
  start_scheduler
  start_kwok
  # One node from the start, so that pods of queues whose flavor selects no nodes run.
  kube apply "$here/standing-node.yaml"

  install_metrics_certs
  write_kueue_config
  start_kueue
  echo "$stamp" >"$RUN_DIR/started-by"
  log "ready in $((SECONDS - start))s: etcd $ETCD_VERSION, Kubernetes $KUBERNETES_VERSION (apiserver, controller manager, scheduler), kwok $KWOK_VERSION, kueue $KUEUE_VERSION"
  log "export KUBECONFIG=$KUBECONFIG_PATH   (logs: $LOGS)"
}

start_apiserver() {
  spawn kube-apiserver --etcd-servers "http://127.0.0.1:$ETCD_PORT" \
    --bind-address 127.0.0.1 --advertise-address 127.0.0.1 --secure-port "$APISERVER_PORT" \
    --tls-cert-file "$PKI/apiserver.crt" --tls-private-key-file "$PKI/apiserver.key" \
    --client-ca-file "$PKI/ca.crt" --authorization-mode RBAC \
    --service-account-issuer "$SERVER" --service-account-key-file "$PKI/sa.pub" \
    --service-account-signing-key-file "$PKI/sa.key" \
    --service-cluster-ip-range 10.0.0.0/24 --disable-admission-plugins ServiceAccount \
    --allow-privileged=true --cert-dir "$RUN_DIR/apiserver-certs" \
    --audit-policy-file "$RUN_DIR/audit-policy.yaml" --audit-log-path "$LOGS/audit.log" \
    --audit-log-format json --audit-log-maxsize 200 --audit-log-maxbackup 1
  wait_for kube-apiserver 90 apiserver_ready
}

# Shared flags of the controller manager and the scheduler: their delegated authentication and
# authorization go through the same admin-level kubeconfig, without the request-header CA lookup
# (this apiserver has no front proxy, and the lookup would only log errors).
component_auth_flags() { # kubeconfig
  printf '%s\n' --kubeconfig "$1" --authentication-kubeconfig "$1" --authorization-kubeconfig "$1" \
    --authentication-skip-lookup --bind-address 127.0.0.1 --leader-elect=false
}

start_controller_manager() {
  local flags
  mapfile -t flags < <(component_auth_flags "$RUN_DIR/kube-controller-manager.kubeconfig")
  spawn kube-controller-manager "${flags[@]}" --secure-port "$CONTROLLER_MANAGER_PORT" \
    --cert-dir "$RUN_DIR/kube-controller-manager-certs" --use-service-account-credentials=false \
    --controllers "$CONTROLLERS"
  wait_for kube-controller-manager 60 controller_manager_ready
}

start_scheduler() {
  local flags
  mapfile -t flags < <(component_auth_flags "$RUN_DIR/kube-scheduler.kubeconfig")
  spawn kube-scheduler "${flags[@]}" --secure-port "$SCHEDULER_PORT" --cert-dir "$RUN_DIR/kube-scheduler-certs"
  wait_for kube-scheduler 60 scheduler_ready
}

# kwok keeps a node Ready by renewing its Lease under a holder name chosen at each start: a new
# kwok process ignores nodes whose Lease another holder renewed until it expires (up to 40 s),
# so the Leases of the fake nodes go first. HOME is its own: kwok also reads ~/.kwok/kwok.yaml.
start_kwok() {
  kube delete-leases kube-node-lease "$KWOK_NODE_ANNOTATION"
  mkdir -p "$RUN_DIR/kwok-home"
  HOME="$RUN_DIR/kwok-home" spawn kwok --kubeconfig "$RUN_DIR/kwok.kubeconfig" --config "$here/kwok-stages.yaml" \
    --manage-all-nodes=false --manage-nodes-with-annotation-selector "$KWOK_NODE_ANNOTATION" \
    --node-lease-duration-seconds 40 --cidr 10.244.0.0/16 --node-ip 10.243.0.1 \
    --server-address "127.0.0.1:$KWOK_PORT"
  wait_for kwok 60 kwok_ready
}

start_kueue() {
  KUBECONFIG="$RUN_DIR/kueue.kubeconfig" spawn kueue --config "$RUN_DIR/kueue-config.yaml" --zap-log-level=2
  wait_for kueue 90 kueue_ready
  # Ready is not enough: prove the apiserver reaches the webhooks through the URL and CA it was given.
  wait_for kueue 30 kube probe-webhooks
}

# One component stopped and started again on the same data, as a node reboot or an upgrade
# would: for fault injection (the chaos soak). etcd keeps its data; clients see their
# connections drop and their watches end.
cmd_restart() { # component
  local c=${1:-}
  case $c in
    kube-apiserver | kueue | kube-controller-manager | kube-scheduler | kwok | karpenter) ;;
    *) die "usage: control-plane.sh restart kube-apiserver|kube-controller-manager|kube-scheduler|kwok|kueue|karpenter" ;;
  esac
  all_running || die "the control plane is not running; start it first"
  local start=$SECONDS
  stop_component "$c"
  case $c in
    kube-apiserver) start_apiserver ;; kueue) write_kueue_config && start_kueue ;;
    kube-controller-manager) start_controller_manager ;; kube-scheduler) start_scheduler ;;
    kwok) start_kwok ;; karpenter) cmd_start_karpenter ;;
  esac
  log "restarted $c in $((SECONDS - start))s"
}

# Karpenter beside the control plane, for the capacity-buffer check: not one of COMPONENTS, so
# `start` (and `make demo`) neither build nor run it. It runs as the admin user; its Nodes carry
# kwok's annotation, so the control plane's kwok makes them Ready and runs their pods.
cmd_start_karpenter() {
  { all_running && all_ready; } || die "the control plane is not running; start it first (control-plane.sh start)"
  if runs_configured_version karpenter && karpenter_ready; then
    log "karpenter already running"
    return 0
  fi
  bash "$here/build.sh" karpenter
  stop_component karpenter
  local entry name port var
  for entry in "karpenter-metrics:$KARPENTER_METRICS_PORT:CP_KARPENTER_METRICS_PORT" \
    "karpenter-health:$KARPENTER_HEALTH_PORT:CP_KARPENTER_HEALTH_PORT"; do
    IFS=: read -r name port var <<<"$entry"
    if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
      die "port $port ($name) is already in use by a process this script did not start; free it or set $var"
    fi
  done
  # No conversion webhook for these: the URL is never called.
  kube apply-crds "https://127.0.0.1:1/unused" "$PKI/ca.crt" "$KARPENTER_MANIFEST_DIR" \
    "$KARPENTER_MANIFEST_DIR"/crds/*.yaml
  # Appended, not truncated: a restart (the soak restarts Karpenter) keeps what came before.
  mkdir -p "$LOGS"
  printf '=== %s: karpenter %s starting\n' "$(date -u +%FT%TZ)" "$KARPENTER_VERSION" >>"$LOGS/karpenter.log"
  # Settings by environment only: Karpenter parses its arguments with a flag set of its own and
  # stops on any it does not define (--kubeconfig among them); KUBECONFIG is read from the
  # environment. One process: no leader election.
  KUBECONFIG="$KUBECONFIG_PATH" DISABLE_LEADER_ELECTION=true FEATURE_GATES="$KARPENTER_FEATURE_GATES" \
    METRICS_PORT="$KARPENTER_METRICS_PORT" HEALTH_PROBE_PORT="$KARPENTER_HEALTH_PORT" LOG_LEVEL=debug \
    spawn karpenter
  wait_for karpenter 120 karpenter_ready
  log "karpenter $KARPENTER_VERSION ready (kwok provider; gates $KARPENTER_FEATURE_GATES; log: $LOGS/karpenter.log)"
}

cmd_stop() {
  local i
  stop_component karpenter
  # Reverse order: Kueue first, so it never sees its apiserver vanish mid-write.
  for ((i = ${#COMPONENTS[@]} - 1; i >= 0; i--)); do stop_component "${COMPONENTS[$i]}"; done
}

cmd_status() {
  local c pid health ok=0
  for c in "${COMPONENTS[@]}"; do
    if pid="$(live_pid "$c")"; then
      if component_ready "$c"; then health=ready; else health="not ready"; ok=1; fi
      if ! runs_configured_version "$c"; then
        health+=", but not the configured version: $(cut -d' ' -f2- "$PIDS/$c.pid")"
        ok=1
      fi
      printf '%-24s running (pid %s), %s\n' "$c" "$pid" "$health"
    else
      printf '%-24s stopped\n' "$c"; ok=1
    fi
  done
  if pid="$(live_pid karpenter)"; then
    if karpenter_ready; then health=ready; else health="not ready"; ok=1; fi
    printf '%-24s running (pid %s), %s\n' karpenter "$pid" "$health"
  fi
  printf 'versions                 etcd %s, Kubernetes %s, kwok %s, kueue %s\n' \
    "$ETCD_VERSION" "$KUBERNETES_VERSION" "$KWOK_VERSION" "$KUEUE_VERSION"
  if apiserver_ready; then printf 'nodes                    %s\n' "$(kube nodes)"; fi
  printf 'kubeconfig               %s\nlogs                     %s\n' "$KUBECONFIG_PATH" "$LOGS"
  return $ok
}

cmd_kubeconfig_for() { # namespace serviceaccount [seconds]
  [[ $# -ge 2 ]] || die "usage: control-plane.sh kubeconfig-for NAMESPACE SERVICEACCOUNT [SECONDS]"
  local token path="$RUN_DIR/sa-$1-$2.kubeconfig"
  token="$(kube token "$1" "$2" "${3:-3600}")"
  write_kubeconfig "$path" "    token: $token"
  echo "$path"
}

# start and stop change shared state: one at a time per run directory (e.g. `make demo` in one
# terminal while `make test` starts in another).
with_lock() {
  mkdir -p "$RUN_DIR"
  exec 9>"$RUN_DIR/.lock"
  flock -w 300 9 || die "another control-plane.sh start/stop held $RUN_DIR/.lock for 5 minutes"
  "$@"
}

case "${1:-}" in
  start) with_lock cmd_start ;;
  stop) with_lock cmd_stop ;;
  start-karpenter) with_lock cmd_start_karpenter ;;
  stop-karpenter) with_lock stop_component karpenter ;;
  restart) shift; with_lock cmd_restart "$@" ;;
  status) cmd_status ;;
  build) bash "$here/build.sh" ;;
  env) printf 'export KUBECONFIG=%q\nexport KUEUE_AC_RUN_DIR=%q\n' "$KUBECONFIG_PATH" "$RUN_DIR" ;;
  kubeconfig-for) shift; cmd_kubeconfig_for "$@" ;;
  *) sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
esac
