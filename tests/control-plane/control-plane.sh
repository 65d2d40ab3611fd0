#!/usr/bin/env bash
# The local control plane for tests and the demo: real etcd, kube-apiserver and Kueue on loopback.
#
#   control-plane.sh start              build if needed, start everything, wait until ready (idempotent)
#   control-plane.sh stop               stop the processes this script started (by pid)
#   control-plane.sh status             what runs, and whether it answers
#   control-plane.sh restart COMPONENT  stop and start kube-apiserver or kueue on the same data
#   control-plane.sh env                shell exports for KUBECONFIG and the run directory
#   control-plane.sh kubeconfig-for NAMESPACE SERVICEACCOUNT [SECONDS]
#                                       a kubeconfig authenticating as that ServiceAccount (RBAC applies)
#   control-plane.sh build              only build the binaries into the cache
#
# Settings (environment): versions in versions.env; KUEUE_AC_CACHE (cache root), KUEUE_AC_RUN_DIR
# (pids, logs, certificates, kubeconfigs), CP_*_PORT (ports below).
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
SERVER="https://127.0.0.1:$APISERVER_PORT"
KUBECONFIG_PATH="$RUN_DIR/admin.kubeconfig"
# The users Kueue and the autoscaler simulator authenticate as (audited; see the audit policy).
KUEUE_USER=kueue-controller-manager
SIMULATOR_USER=autoscaler-simulator
# Kueue v0.15+ reads its metrics serving certificate from this fixed path when it does not
# manage certificates itself (cmd/kueue/main.go); there is no setting to move it.
KUEUE_METRICS_CERT_DIR=/etc/kueue/metrics/certs
COMPONENTS=(etcd kube-apiserver kueue)

export CP_PKI_DIR="$PKI" CP_SERVER="$SERVER"
kube() { python3 "$here/kube.py" "$@"; }

# --- processes ---------------------------------------------------------------------------------

binary_of() {
  case $1 in etcd) echo "$ETCD_BIN" ;; kube-apiserver) echo "$APISERVER_BIN" ;; kueue) echo "$KUEUE_BIN" ;; esac
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
  echo "$! $bin" >"$PIDS/$name.pid"
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

# --- certificates and configuration ------------------------------------------------------------

make_pki() {
  [[ -f $PKI/.complete-v2 ]] && return 0
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
    # ServiceAccount token signing key (RSA: the apiserver's issuer uses RS256).
    openssl genpkey -algorithm RSA -pkeyopt rsa_keygen_bits:2048 -out sa.key 2>/dev/null
    openssl pkey -in sa.key -pubout -out sa.pub
    mkdir -p kueue-webhook-certs
    cp kueue-webhook.crt kueue-webhook-certs/tls.crt
    cp kueue-webhook.key kueue-webhook-certs/tls.key
  )
  touch "$PKI/.complete-v2"
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
  qps: 300
  burst: 500
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
    "kueue-health:$KUEUE_HEALTH_PORT:CP_KUEUE_HEALTH_PORT" "kueue-metrics:$KUEUE_METRICS_PORT:CP_KUEUE_METRICS_PORT"; do
    IFS=: read -r name port var <<<"$entry"
    if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
      die "port $port ($name) is already in use by a process this script did not start; free it or set $var"
    fi
  done
}

all_running() { local c; for c in "${COMPONENTS[@]}"; do runs_configured_version "$c" || return 1; done; }

cmd_start() {
  command -v curl >/dev/null || die "curl is required"
  python3 -c 'import yaml' 2>/dev/null || die "python3 with PyYAML is required (Debian: python3-yaml)"
  # A control plane started by another version of these scripts (another Kueue config, other
  # users) is started again.
  local stamp
  stamp="$(cat "$here/control-plane.sh" "$here/lib.sh" "$here/versions.env" | sha256sum | cut -c1-16)"
  if all_running && [[ $(cat "$RUN_DIR/started-by" 2>/dev/null) == "$stamp" ]] &&
    apiserver_ready && kueue_ready; then
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
  : >"$LOGS/etcd.log"; : >"$LOGS/kube-apiserver.log"; : >"$LOGS/kueue.log"; : >"$LOGS/audit.log"
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

  install_metrics_certs
  write_kueue_config
  start_kueue
  echo "$stamp" >"$RUN_DIR/started-by"
  log "ready in $((SECONDS - start))s: etcd $ETCD_VERSION, kube-apiserver $KUBERNETES_VERSION, kueue $KUEUE_VERSION"
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
    kube-apiserver | kueue) ;;
    *) die "usage: control-plane.sh restart kube-apiserver|kueue" ;;
  esac
  all_running || die "the control plane is not running; start it first"
  local start=$SECONDS
  stop_component "$c"
  if [[ $c == kube-apiserver ]]; then start_apiserver; else start_kueue; fi
  log "restarted $c in $((SECONDS - start))s"
}

cmd_stop() {
  local i
  # Reverse order: Kueue first, so it never sees its apiserver vanish mid-write.
  for ((i = ${#COMPONENTS[@]} - 1; i >= 0; i--)); do stop_component "${COMPONENTS[$i]}"; done
}

cmd_status() {
  local c pid health ok=0
  for c in "${COMPONENTS[@]}"; do
    if pid="$(live_pid "$c")"; then
      case $c in
        etcd) etcd_healthy && health=healthy || health=unhealthy ;;
        kube-apiserver) apiserver_ready && health=ready || health="not ready" ;;
        kueue) kueue_ready && health=ready || health="not ready" ;;
      esac
      if ! runs_configured_version "$c"; then
        health+=", but not the configured version: $(cut -d' ' -f2- "$PIDS/$c.pid")"
        ok=1
      fi
      printf '%-15s running (pid %s), %s\n' "$c" "$pid" "$health"
      [[ $health == healthy || $health == ready ]] || ok=1
    else
      printf '%-15s stopped\n' "$c"; ok=1
    fi
  done
  printf 'versions        etcd %s, kube-apiserver %s, kueue %s\n' "$ETCD_VERSION" "$KUBERNETES_VERSION" "$KUEUE_VERSION"
  printf 'kubeconfig      %s\nlogs            %s\n' "$KUBECONFIG_PATH" "$LOGS"
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
  restart) shift; with_lock cmd_restart "$@" ;;
  status) cmd_status ;;
  build) bash "$here/build.sh" ;;
  env) printf 'export KUBECONFIG=%q\nexport KUEUE_AC_RUN_DIR=%q\n' "$KUBECONFIG_PATH" "$RUN_DIR" ;;
  kubeconfig-for) shift; cmd_kubeconfig_for "$@" ;;
  *) sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
esac
