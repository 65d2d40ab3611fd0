#!/usr/bin/env bash
# The charts, proven: lint, render, assert, refuse bad values, check the dashboard and the alerts,
# and apply every rendering to the local kube-apiserver under the `restricted` Pod Security
# Standard without a single warning.
#
#   1. helm lint --strict, both charts, defaults and every ci/*-values.yaml;
#   2. helm template of each variant, and assertions on the objects (check_rendered.py);
#   3. values the charts must refuse, each with its reason;
#   4. the dashboard and the alerts against the metrics the code defines, every PromQL parsed and
#      the alerts unit-tested by promtool (check_observability.py, alerts_test.yaml);
#   5. each variant applied (server-side apply, strict field validation) in a namespace of its own,
#      chart-<chart>-<variant>, that enforces, warns and audits `restricted`: any warning fails;
#      a Pod from each Deployment's template is created with dryRun to have `enforce` judge it;
#      ServiceMonitor and PrometheusRule are validated by prometheus-operator's CRDs. A control
#      first proves that this namespace's PodSecurity admission does refuse a bad pod.
#
# Needs the local control plane running (tests/control-plane/control-plane.sh start), as every
# end-to-end test: it is never skipped. Objects stay (namespaces never finish deleting there);
# a re-run applies them again. The ServiceAccount of variant V of the provisioning chart is
# chart-kpc-V/chart-kpc-V-kueue-provisioning-controller.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
# shellcheck source=tests/helm/lib.sh
source tests/helm/lib.sh

KPC=charts/kueue-provisioning-controller
KAC=charts/kueue-admission-check
KCB=charts/kueue-capacity-buffer-controller
step() { printf '\n--- %s\n' "$*" >&2; }
start=$SECONDS

helm="$(bash tests/helm/install-helm.sh)"
promtool="$(bash tests/helm/install-promtool.sh)"
out="$(mktemp -d "${TMPDIR:-/tmp}/check-chart.XXXXXX")"
trap 'rm -rf "$out"' EXIT

# chart-short variant values-file (or "-") replicas leader-election kinds rbac-golden (or "-")
# container-args (comma-separated, each exactly so; or "-")
DEFAULT_ARGS=--max-retry-delay-seconds=86400,--permanent-failure-hold-seconds=120
VARIANTS=(
  "kpc default - 2 true ClusterRole,ClusterRole,ClusterRoleBinding,Deployment,PodDisruptionBudget,Role,RoleBinding,Service,ServiceAccount provisioning $DEFAULT_ARGS"
  "kpc single-replica $KPC/ci/single-replica-values.yaml 1 false ClusterRole,ClusterRole,ClusterRoleBinding,Deployment,Service,ServiceAccount provisioning --max-retry-delay-seconds=3600,--permanent-failure-hold-seconds=0,--provisioning-timeout-seconds=900"
  "kpc monitoring $KPC/ci/monitoring-values.yaml 2 true ClusterRole,ClusterRole,ClusterRoleBinding,ConfigMap,Deployment,PodDisruptionBudget,PrometheusRule,Role,RoleBinding,Service,ServiceAccount,ServiceMonitor provisioning $DEFAULT_ARGS"
  "kpc admission-checks $KPC/ci/admission-checks-values.yaml 2 true AdmissionCheck,AdmissionCheck,ClusterRole,ClusterRole,ClusterRoleBinding,Deployment,PodDisruptionBudget,ProvisioningRequestConfig,Role,RoleBinding,Service,ServiceAccount provisioning $DEFAULT_ARGS"
  "kpc metrics-tls $KPC/ci/metrics-tls-values.yaml 2 true ClusterRole,ClusterRole,ClusterRoleBinding,Deployment,PodDisruptionBudget,Role,RoleBinding,Service,ServiceAccount,ServiceMonitor provisioning $DEFAULT_ARGS,--metrics-tls-cert=/var/run/secrets/metrics-tls/tls.crt,--metrics-tls-key=/var/run/secrets/metrics-tls/tls.key"
  "kpc plain-metrics $KPC/ci/plain-metrics-values.yaml 2 true ClusterRole,ClusterRoleBinding,Deployment,PodDisruptionBudget,Role,RoleBinding,Service,ServiceAccount,ServiceMonitor - $DEFAULT_ARGS,--metrics-secure=false,--metrics-address=0.0.0.0:8080"
  "kac budget-check $KAC/ci/budget-check-values.yaml 2 true AdmissionCheck,ClusterRole,ClusterRole,ClusterRoleBinding,Deployment,PodDisruptionBudget,Role,RoleBinding,Service,ServiceAccount - $DEFAULT_ARGS"
  "kac alert-gate $KAC/ci/alert-gate-values.yaml 2 true AdmissionCheck,ClusterRole,ClusterRole,ClusterRoleBinding,Deployment,PodDisruptionBudget,Role,RoleBinding,Service,ServiceAccount - $DEFAULT_ARGS,--withdraw-ready-seconds=60"
  "kcb default $KCB/ci/default-values.yaml 2 true ClusterRole,ClusterRole,ClusterRoleBinding,Deployment,PodDisruptionBudget,Role,RoleBinding,Service,ServiceAccount - $DEFAULT_ARGS"
  "kcb monitoring $KCB/ci/monitoring-values.yaml 2 true AdmissionCheck,ClusterRole,ClusterRole,ClusterRoleBinding,ConfigMap,Deployment,PodDisruptionBudget,PrometheusRule,Role,RoleBinding,Service,ServiceAccount,ServiceMonitor - $DEFAULT_ARGS"
  "kac parameters $KAC/ci/parameters-values.yaml 1 false AdmissionCheck,ClusterRole,ClusterRole,ClusterRoleBinding,Deployment,PrometheusRule,Service,ServiceAccount,ServiceMonitor - --max-retry-delay-seconds=2147483647,--permanent-failure-hold-seconds=86400,--shadow=true,--shadow-cluster-queues=team-a"
)
chart_dir() { case $1 in kpc) echo "$KPC" ;; kac) echo "$KAC" ;; kcb) echo "$KCB" ;; esac; }

# Renders a variant as release and namespace chart-<chart>-<variant> into $out; prints the path.
render() { # chart-short variant values-file [helm args...]
  local chart=$1 variant=$2 values=$3 ns; shift 3
  ns="chart-$chart-$variant"
  local args=(template "$ns" "$(chart_dir "$chart")" --namespace "$ns")
  [[ $values == - ]] || args+=(-f "$values")
  "$helm" "${args[@]}" "$@" >"$out/$ns.yaml" || hdie "helm template of $chart $variant failed"
  echo "$out/$ns.yaml"
}

# The capacity-buffer chart is the generic one under `controller:` (a file:// dependency).
"$helm" dependency build "$KCB" >"$out/dependency.log" 2>&1 || { cat "$out/dependency.log" >&2; hdie "helm dependency build $KCB"; }

# Lint renders every template, NOTES.txt included, with each values file.
step "helm lint --strict"
n=0
"$helm" lint --strict "$KPC" >"$out/lint.log" 2>&1 || { cat "$out/lint.log" >&2; hdie "helm lint $KPC (defaults)"; }
for f in "$KPC"/ci/*-values.yaml "$KAC"/ci/*-values.yaml "$KCB"/ci/*-values.yaml; do
  "$helm" lint --strict "${f%/ci/*}" -f "$f" >"$out/lint.log" 2>&1 || { cat "$out/lint.log" >&2; hdie "helm lint ${f%/ci/*} -f $f"; }
  n=$((n + 1))
done
hlog "the charts lint clean (defaults, $n value files)"

step "helm template and assertions on the rendered objects"
for v in "${VARIANTS[@]}"; do
  read -r chart variant values replicas leader kinds rbac want_args <<<"$v"
  file="$(render "$chart" "$variant" "$values")"
  extra=()
  [[ $rbac == - ]] || extra=(--rbac "$rbac")
  if [[ $want_args != - ]]; then
    IFS=, read -r -a expected <<<"$want_args"
    # --arg=VALUE: each value starts with "--".
    for a in "${expected[@]}"; do extra+=("--arg=$a"); done
  fi
  python3 tests/helm/check_rendered.py "$file" --namespace "chart-$chart-$variant" --replicas "$replicas" \
    --leader-election "$leader" --kinds "$kinds" "${extra[@]}"
done
# The generic chart grants exactly the SDK runtime's rules when the check adds none of its own.
file="$(render kac sdk-only - --set image.repository=r/x,image.tag=v1,controllerName=example.com/x)"
python3 tests/helm/check_rendered.py "$file" --namespace chart-kac-sdk-only --replicas 2 --leader-election true --rbac sdk \
  "--arg=--max-retry-delay-seconds=86400" "--arg=--permanent-failure-hold-seconds=120"

step "values the charts refuse"
refuse() { # expected-message chart [helm args...]
  local want=$1 chart=$2 err; shift 2
  if err="$("$helm" template refused "$chart" "$@" 2>&1 >/dev/null)"; then
    hdie "$chart $* rendered, but should be refused ($want)"
  fi
  grep -qF -- "$want" <<<"$err" || hdie "$chart $*: refused, but not for \"$want\": $err"
  hlog "refused: $chart $* ($want)"
}
refuse "needs leaderElection.enabled" "$KPC" --set leaderElection.enabled=false
refuse "belongs to Kueue's built-in controller" "$KPC" --set controllerName=kueue.x-k8s.io/provisioning-request
refuse "additional properties 'replicas' not allowed" "$KPC" --set replicas=3
refuse "leaseDurationSeconds" "$KPC" --set leaderElection.leaseDurationSeconds=1
refuse "provisioningClassName" "$KPC" --set 'admissionChecks[0].name=x' --set 'admissionChecks[0].provisioningRequestConfig.spec.managedResources[0]=cpu'
refuse "needs metrics.service.enabled" "$KPC" --set metrics.serviceMonitor.enabled=true --set metrics.service.enabled=false
refuse "health.port must differ from metrics.port" "$KPC" --set health.port=8443
refuse "metrics.secure is false" "$KPC" --set metrics.secure=false --set metrics.tls.secretName=metrics-tls
# The SDK's own ranges (sdk/src/options.rs): a value the binary refuses never reaches a pod.
for c in "$KPC" "$KAC"; do
  sdk=()
  [[ $c == "$KAC" ]] && sdk=(--set "image.repository=r/x,image.tag=v1,controllerName=e.com/x")
  refuse "at '/maxRetryDelaySeconds': minimum" "$c" "${sdk[@]}" --set maxRetryDelaySeconds=0
  refuse "at '/maxRetryDelaySeconds': maximum" "$c" "${sdk[@]}" --set maxRetryDelaySeconds=2147483648
  refuse "at '/maxRetryDelaySeconds': got number, want integer" "$c" "${sdk[@]}" --set-json maxRetryDelaySeconds=1.5
  refuse "at '/permanentFailureHoldSeconds': minimum" "$c" "${sdk[@]}" --set permanentFailureHoldSeconds=-1
  refuse "at '/permanentFailureHoldSeconds': maximum" "$c" "${sdk[@]}" --set permanentFailureHoldSeconds=86401
  # `--set x=null` deletes the value instead of failing the schema: the template must refuse it.
  refuse "permanentFailureHoldSeconds is required" "$c" "${sdk[@]}" --set permanentFailureHoldSeconds=null
  refuse "maxRetryDelaySeconds is required" "$c" "${sdk[@]}" --set maxRetryDelaySeconds=null
done
refuse "at '/shadow/clusterQueues/0'" "$KAC" --set image.repository=r/x,image.tag=v1,controllerName=e.com/x \
  --set shadow.enabled=true --set-json 'shadow.clusterQueues=["Team A"]'
refuse "image.repository is required" "$KAC"
refuse "image.repository is required" "$KCB"
refuse "controllerName is required" "$KAC" --set image.repository=r/x,image.tag=v1
refuse "verbs" "$KAC" --set image.repository=r/x,image.tag=v1,controllerName=e.com/x \
  --set 'rbac.clusterRules[0].apiGroups[0]=' --set 'rbac.clusterRules[0].resources[0]=pods' --set 'rbac.clusterRules[0].verbs[0]=*'

step "dashboard and alerts against the metrics in the code; promtool"
"$helm" template kpc "$KPC" --namespace monitoring --set fullnameOverride=kpc \
  --set metrics.prometheusRule.enabled=true >"$out/alerts-under-test.yaml"
python3 tests/helm/check_observability.py \
  --dashboard "$KPC/dashboards/kueue-admission-checks.json" \
  --rules "$out/chart-kpc-monitoring.yaml,$out/chart-kac-parameters.yaml" \
  --docs docs/operating.md \
  --require-alerts KueueAdmissionCheckInactive,KueueAdmissionCheckClaimedElsewhere,KueueAdmissionCheckRetriesPilingUp,KueueProvisioningRequestsTimingOut,KueueAdmissionCheckNoLeader,KueueAdmissionCheckControllerDown,KueueAdmissionCheckPermanentFailures,KueueAdmissionCheckRetryDelaysClamped \
  --promtool "$promtool" --alerts-test tests/helm/alerts_test.yaml --test-rules "$out/alerts-under-test.yaml"
# The dashboard the chart ships in its ConfigMap is the file itself.
python3 - "$out/chart-kpc-monitoring.yaml" "$KPC/dashboards/kueue-admission-checks.json" <<'PY'
import json, sys, yaml
cm = next(d for d in yaml.safe_load_all(open(sys.argv[1])) if d and d["kind"] == "ConfigMap")
assert json.loads(cm["data"]["kueue-admission-checks.json"]) == json.load(open(sys.argv[2])), "ConfigMap differs"
PY
python3 - "$out/chart-kcb-monitoring.yaml" "$KCB/dashboards/kueue-admission-checks.json" <<'PY'
import json, sys, yaml
cm = next(d for d in yaml.safe_load_all(open(sys.argv[1])) if d and d["kind"] == "ConfigMap")
assert json.loads(cm["data"]["kueue-admission-checks.json"]) == json.load(open(sys.argv[2])), "ConfigMap differs"
PY

step "apply to the local kube-apiserver, restricted Pod Security Standard, no warnings"
cp_sh=tests/control-plane/control-plane.sh
bash "$cp_sh" status >/dev/null 2>&1 ||
  hdie "the local control plane is not running; start it: $cp_sh start"
eval "$(bash "$cp_sh" env)"
kapply() { python3 tests/helm/kube_apply.py "$KUBECONFIG" "$@"; }
# prometheus-operator's CRDs, from its Go module, so that the API server validates the chart's
# ServiceMonitor and PrometheusRule against their real schemas.
pdir="$(module_dir github.com/prometheus-operator/prometheus-operator "$PROMETHEUS_OPERATOR_VERSION")" ||
  hdie "could not download prometheus-operator $PROMETHEUS_OPERATOR_VERSION"
kapply crds "$pdir/example/prometheus-operator-crd/monitoring.coreos.com_servicemonitors.yaml" \
  "$pdir/example/prometheus-operator-crd/monitoring.coreos.com_prometheusrules.yaml"
first=true
for v in "${VARIANTS[@]}"; do
  read -r chart variant values _ <<<"$v"
  ns="chart-$chart-$variant"
  kapply namespace "$ns"
  if $first; then kapply pss-controls "$ns"; first=false; fi
  kapply apply "$ns" "$out/$ns.yaml"
done

hlog "charts OK in $((SECONDS - start))s"
