#!/usr/bin/env python3
"""Assertions on a chart's rendered objects (`helm template` output).

    check_rendered.py FILE --namespace NS --replicas N --leader-election true|false
                      [--kinds Kind,Kind,...] [--rbac provisioning|sdk] [--arg --flag=value ...]

Checks the conventions and the security properties every variant must keep, whatever the
values: labels, least-privilege RBAC (no wildcard, no escalation verb, no secret, nothing bound
to a built-in role; with --rbac, the exact ClusterRole), a pod that passes the `restricted` Pod
Security Standard, requests and limits, probes on the SDK's health endpoints, and objects that
reference each other consistently (ServiceAccount, Lease name, Service and PDB selectors, ports),
and SDK flags the chart always passes, each an integer within the range the binary accepts (with
--arg, exactly that value).
"""
import argparse

import yaml

from chart_failures import check, finish


# The ClusterRole rules, exactly: what the code calls (see templates/clusterrole.yaml). A change
# here must be a change of the code's calls.
SDK_RULES = {
    ("kueue.x-k8s.io", "admissionchecks"): {"get", "list", "watch"},
    ("kueue.x-k8s.io", "admissionchecks/status"): {"patch"},
    # patch: the check's attempt annotation (sdk/src/attempts.rs), written before each Retry.
    ("kueue.x-k8s.io", "workloads"): {"get", "list", "watch", "patch"},
    ("kueue.x-k8s.io", "workloads/status"): {"patch"},
    ("events.k8s.io", "events"): {"create", "patch"},
    # Authenticated /metrics (sdk/src/runtime/metrics_auth.rs): each scraper's token reviewed.
    ("authentication.k8s.io", "tokenreviews"): {"create"},
    ("authorization.k8s.io", "subjectaccessreviews"): {"create"},
}
PROVISIONING_RULES = {**SDK_RULES, **{
    ("kueue.x-k8s.io", "provisioningrequestconfigs"): {"get", "list", "watch"},
    ("kueue.x-k8s.io", "resourceflavors"): {"list", "watch"},
    ("kueue.x-k8s.io", "clusterqueues"): {"list", "watch"},
    ("autoscaling.x-k8s.io", "provisioningrequests"): {"get", "list", "watch", "create", "delete"},
    ("", "podtemplates"): {"get", "list", "create", "delete"},
    ("", "pods"): {"list"},
}}
# Integer flags of sdk::Options the Deployments always pass, with the ranges its parser accepts
# (sdk/src/options.rs): a value outside them would make the pod exit with status 2 at start.
SDK_INT_FLAGS = {
    "--concurrency": (1, 65535),
    "--kube-api-burst": (1, 100_000),
    "--max-retry-delay-seconds": (1, 2**31 - 1),
    "--permanent-failure-hold-seconds": (0, 86_400),
}
FORBIDDEN_VERBS = {"*", "escalate", "bind", "impersonate", "deletecollection"}
BUILTIN_ROLES = {"cluster-admin", "admin", "edit", "view"}
REQUIRED_LABELS = ["helm.sh/chart", "app.kubernetes.io/name", "app.kubernetes.io/instance",
                   "app.kubernetes.io/version", "app.kubernetes.io/managed-by"]
CLUSTER_SCOPED = {"ClusterRole", "ClusterRoleBinding", "AdmissionCheck", "ProvisioningRequestConfig",
                  "Namespace", "CustomResourceDefinition"}


def flatten(rules):
    """{(group, resource): verbs} of a list of PolicyRules (no resourceNames)."""
    out = {}
    for r in rules:
        for g in r.get("apiGroups", []):
            for res in r.get("resources", []):
                out.setdefault((g, res), set()).update(r.get("verbs", []))
    return out


def is_metrics_reader(d):
    """The ClusterRole for scrapers of the authenticated /metrics: exactly get on /metrics."""
    return d["kind"] == "ClusterRole" and d["metadata"]["name"].endswith("-metrics-reader")


def check_rbac(docs, args):
    roles = {(d["kind"], d["metadata"]["name"]): d for d in docs if d["kind"] in ("ClusterRole", "Role")}
    for d in roles.values():
        name = f"{d['kind']} {d['metadata']['name']}"
        if is_metrics_reader(d):
            check(d.get("rules") == [{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}],
                  f"{name}: expected only get on /metrics, got {d.get('rules')}")
            check(not any(b["roleRef"]["name"] == d["metadata"]["name"] for b in docs
                          if b["kind"] in ("ClusterRoleBinding", "RoleBinding")),
                  f"{name} is bound by the chart: the operator binds it to Prometheus")
            continue
        for r in d.get("rules", []):
            for field in ("apiGroups", "resources", "verbs", "resourceNames"):
                check("*" not in r.get(field, []), f"{name}: wildcard in {field}: {r}")
            check(not (set(r.get("verbs", [])) & FORBIDDEN_VERBS), f"{name}: forbidden verb in {r}")
            check("nonResourceURLs" not in r, f"{name}: nonResourceURLs in {r}")
            check(not ({"secrets", "pods/exec", "serviceaccounts/token"} & set(r.get("resources", []))),
                  f"{name}: grants {r.get('resources')}")
    for d in docs:
        if d["kind"] in ("ClusterRoleBinding", "RoleBinding"):
            ref = d["roleRef"]
            check(ref["name"] not in BUILTIN_ROLES, f"{d['kind']} {d['metadata']['name']} binds {ref['name']}")
            check((ref["kind"], ref["name"]) in roles,
                  f"{d['kind']} {d['metadata']['name']} binds {ref['kind']} {ref['name']}, which the chart does not render")
    cluster_roles = [d for d in roles.values() if d["kind"] == "ClusterRole" and not is_metrics_reader(d)]
    if args.rbac and check(len(cluster_roles) == 1, f"expected one ClusterRole, got {len(cluster_roles)}"):
        want = PROVISIONING_RULES if args.rbac == "provisioning" else SDK_RULES
        got = flatten(r for r in cluster_roles[0]["rules"] if "resourceNames" not in r)
        for key in sorted(set(want) | set(got)):
            check(want.get(key) == got.get(key),
                  f"ClusterRole: {key[0] or 'core'}/{key[1]}: verbs {sorted(got.get(key, []))}, expected {sorted(want.get(key, []))}")


def container_args(c):
    out = {}
    for a in c.get("args", []):
        if a.startswith("--") and "=" in a:
            k, v = a.split("=", 1)
            out[k] = v
    return out


def check_deployment(docs, args):
    deployments = [d for d in docs if d["kind"] == "Deployment"]
    if not check(len(deployments) == 1, f"expected one Deployment, got {len(deployments)}"):
        return
    d = deployments[0]
    spec, pod = d["spec"], d["spec"]["template"]["spec"]
    check(spec.get("replicas") == args.replicas, f"replicas {spec.get('replicas')}, expected {args.replicas}")
    check(spec["selector"]["matchLabels"].items() <= d["spec"]["template"]["metadata"]["labels"].items(),
          "the Deployment's selector does not select its own pods")
    psc = pod.get("securityContext", {})
    check(psc.get("runAsNonRoot") is True, "pod securityContext.runAsNonRoot is not true")
    check(psc.get("runAsUser", 1) != 0, "pod runs as uid 0")
    check((psc.get("seccompProfile") or {}).get("type") == "RuntimeDefault", "pod seccompProfile is not RuntimeDefault")
    for key in ("hostNetwork", "hostPID", "hostIPC"):
        check(not pod.get(key), f"pod sets {key}")
    check(not any("hostPath" in v for v in pod.get("volumes", [])), "pod mounts a hostPath")
    containers = pod["containers"]
    check(len(containers) == 1 and not pod.get("initContainers"), "expected exactly one container")
    c = containers[0]
    sc = c.get("securityContext", {})
    check(sc.get("allowPrivilegeEscalation") is False, "allowPrivilegeEscalation is not false")
    check(sc.get("readOnlyRootFilesystem") is True, "readOnlyRootFilesystem is not true")
    check(sc.get("privileged") in (None, False), "container is privileged")
    check("ALL" in (sc.get("capabilities") or {}).get("drop", []), "capabilities.drop lacks ALL")
    check(not (sc.get("capabilities") or {}).get("add"), "capabilities.add is set")
    res = c.get("resources", {})
    for kind in ("requests", "limits"):
        for r in ("cpu", "memory"):
            check(r in res.get(kind, {}), f"resources.{kind}.{r} is not set")
    image = c.get("image", "")
    check(("@sha256:" in image) or (":" in image.rsplit("/", 1)[-1]), f"image {image!r} has neither tag nor digest")
    a = container_args(c)
    ports = {p["name"]: p["containerPort"] for p in c.get("ports", [])}
    check("metrics" in ports, "no container port named metrics")
    check(a.get("--metrics-address") == f"0.0.0.0:{ports.get('metrics')}",
          f"--metrics-address {a.get('--metrics-address')} does not serve the metrics port {ports.get('metrics')}")
    check("health" in ports and ports.get("health") != ports.get("metrics"),
          f"no container port named health apart from metrics: {ports}")
    check(a.get("--health-address") == f"0.0.0.0:{ports.get('health')}",
          f"--health-address {a.get('--health-address')} does not serve the health port {ports.get('health')}")
    check(a.get("--metrics-secure") in ("true", "false"), f"--metrics-secure {a.get('--metrics-secure')!r}")
    for probe, path in (("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")):
        get = (c.get(probe) or {}).get("httpGet") or {}
        check(get.get("path") == path and get.get("port") in ("health", ports.get("health"))
              and get.get("scheme", "HTTP") == "HTTP",
              f"{probe} is not a plain HTTP GET of {path} on the health port: {c.get(probe)}")
    secure = a.get("--metrics-secure") == "true"
    readers = [x for x in docs if is_metrics_reader(x)]
    check(secure or not readers, "a metrics-reader ClusterRole for plain metrics")
    for sm in (x for x in docs if x["kind"] == "ServiceMonitor"):
        for e in sm["spec"]["endpoints"]:
            check(e.get("scheme") == ("https" if secure else "http"),
                  f"the ServiceMonitor scrapes {e.get('scheme')}, the metrics are {'HTTPS' if secure else 'plain'}")
            if secure:
                check("bearerTokenFile" in e or "authorization" in e, "the ServiceMonitor sends no token")
                check("tlsConfig" in e, "the ServiceMonitor has no tlsConfig for HTTPS")
    env = {e["name"]: e for e in c.get("env", [])}
    for name, field in (("POD_NAME", "metadata.name"), ("POD_NAMESPACE", "metadata.namespace")):
        check(((env.get(name) or {}).get("valueFrom") or {}).get("fieldRef", {}).get("fieldPath") == field,
              f"env {name} is not the downward API's {field}")
    for flag, (lo, hi) in SDK_INT_FLAGS.items():
        value = a.get(flag)
        check(value is not None and value.isdigit() and lo <= int(value) <= hi,
              f"{flag}={value}: expected an integer in [{lo}, {hi}]")
    for want in args.arg:
        flag, _, value = want.partition("=")
        check(a.get(flag) == value, f"{flag}={a.get(flag)}, expected {value}")
    elect = a.get("--leader-elect")
    check(elect == args.leader_election, f"--leader-elect={elect}, expected {args.leader_election}")
    if args.leader_election == "true":
        lease = a.get("--leader-election-id")
        roles = [r for r in docs if r["kind"] == "Role"]
        granted = {tuple(sorted(r.get("verbs", []))): r.get("resourceNames") for role in roles for r in role["rules"]
                   if r.get("resources") == ["leases"]}
        check(granted.get(("create",), "absent") is None, f"the Lease Role does not grant create (unnamed): {granted}")
        check(granted.get(("get", "patch")) == [lease],
              f"the Lease Role grants get, patch on {granted.get(('get', 'patch'))}, the controller uses the Lease {lease}")
        check(set(granted) == {("create",), ("get", "patch")}, f"unexpected Lease rules {granted}")
    else:
        check(not any(r.get("resources") == ["leases"] for role in docs if role["kind"] == "Role"
                      for r in role["rules"]), "a Lease Role without leader election")
    sa = pod.get("serviceAccountName")
    sas = [x["metadata"]["name"] for x in docs if x["kind"] == "ServiceAccount"]
    check(not sas or sa in sas, f"the pod runs as {sa}, the chart creates {sas}")
    for b in (x for x in docs if x["kind"] in ("ClusterRoleBinding", "RoleBinding")):
        check(any(s["name"] == sa and s["namespace"] == args.namespace for s in b["subjects"]),
              f"{b['kind']} {b['metadata']['name']} does not bind {args.namespace}/{sa}")
    pod_labels = d["spec"]["template"]["metadata"]["labels"]
    for svc in (x for x in docs if x["kind"] == "Service"):
        check(svc["spec"]["selector"].items() <= pod_labels.items(), "the Service does not select the pods")
        check(all(p["targetPort"] in ports or p["targetPort"] in ports.values() for p in svc["spec"]["ports"]),
              "the Service targets a port the container does not have")
    for pdb in (x for x in docs if x["kind"] == "PodDisruptionBudget"):
        check(pdb["spec"]["selector"]["matchLabels"].items() <= pod_labels.items(), "the PDB does not select the pods")
        check("maxUnavailable" in pdb["spec"] and "minAvailable" not in pdb["spec"],
              "the PDB should bound maxUnavailable (a minAvailable can block drains)")
    for sm in (x for x in docs if x["kind"] == "ServiceMonitor"):
        svcs = [x for x in docs if x["kind"] == "Service"]
        check(any(sm["spec"]["selector"]["matchLabels"].items() <= s["metadata"]["labels"].items() for s in svcs),
              "the ServiceMonitor selects no Service of the chart")
        svc_ports = {p["name"] for s in svcs for p in s["spec"]["ports"]}
        check(all(e["port"] in svc_ports for e in sm["spec"]["endpoints"]), "the ServiceMonitor scrapes an unknown port")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("file")
    p.add_argument("--namespace", required=True)
    p.add_argument("--replicas", type=int, required=True)
    p.add_argument("--leader-election", choices=["true", "false"], required=True)
    p.add_argument("--kinds", help="the kinds rendered, comma-separated, sorted")
    p.add_argument("--rbac", choices=["provisioning", "sdk"])
    p.add_argument("--arg", action="append", default=[], metavar="--FLAG=VALUE",
                   help="an argument the container must have (repeatable)")
    args = p.parse_args()
    with open(args.file) as f:
        docs = [d for d in yaml.safe_load_all(f) if d]
    for d in docs:
        name = f"{d.get('kind')} {d.get('metadata', {}).get('name')}"
        labels = d.get("metadata", {}).get("labels") or {}
        check(all(k in labels for k in REQUIRED_LABELS), f"{name}: lacks labels {[k for k in REQUIRED_LABELS if k not in labels]}")
        if d["kind"] in CLUSTER_SCOPED:
            check("namespace" not in d["metadata"], f"{name}: cluster-scoped, with a namespace")
        elif d["kind"] != "ConfigMap":
            check(d["metadata"].get("namespace") == args.namespace, f"{name}: namespace {d['metadata'].get('namespace')}")
    if args.kinds is not None:
        got = ",".join(sorted(d["kind"] for d in docs))
        check(got == args.kinds, f"kinds rendered: {got}; expected {args.kinds}")
    check_rbac(docs, args)
    check_deployment(docs, args)
    finish(f"{args.file}: ", f"{len(docs)} objects OK")


if __name__ == "__main__":
    main()
