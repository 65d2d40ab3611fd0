#!/usr/bin/env python3
"""Applies rendered chart objects to an API server and fails on any warning: no kubectl needed.

    kube_apply.py KUBECONFIG namespace NS                  the namespace, labelled to enforce, warn
                                                           and audit the `restricted` Pod Security
                                                           Standard
    kube_apply.py KUBECONFIG crds FILE...                  apply CRDs, wait until Established
    kube_apply.py KUBECONFIG apply NS FILE...              server-side apply of every object (strict
                                                           field validation), then a dry-run Pod from
                                                           every Deployment's template in NS, which
                                                           the PodSecurity admission enforces
    kube_apply.py KUBECONFIG pss-controls NS               proves the namespace's PodSecurity
                                                           admission bites: a privileged Deployment
                                                           gets warnings and its Pod is refused

Every request's `Warning` response headers are collected; any warning fails the command (the
apiserver warns about deprecated APIs, unknown fields, and templates that violate the namespace's
`warn` level). Objects are applied with server-side apply, so a re-run converges.
"""
import base64
import copy
import json
import os
import ssl
import sys
import tempfile
import urllib.error
import urllib.parse
import urllib.request

import yaml

# The control plane's client module: reading manifests and waiting for CRDs are the same here.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "control-plane"))
from kube import documents, wait_established  # noqa: E402

FIELD_MANAGER = "kueue-ac-chart-test"
PSS_LABELS = {
    "pod-security.kubernetes.io/enforce": "restricted",
    "pod-security.kubernetes.io/enforce-version": "latest",
    "pod-security.kubernetes.io/warn": "restricted",
    "pod-security.kubernetes.io/warn-version": "latest",
    "pod-security.kubernetes.io/audit": "restricted",
    "pod-security.kubernetes.io/audit-version": "latest",
}


def fail(msg):
    print(f"[kube-apply] error: {msg}", file=sys.stderr)
    sys.exit(1)


def log(msg):
    print(f"[kube-apply] {msg}", file=sys.stderr)


class Client:
    """An API client from a kubeconfig's current context: client certificate or bearer token."""

    def __init__(self, path):
        with open(path) as f:
            config = yaml.safe_load(f)
        current = config["current-context"]
        context = next(c["context"] for c in config["contexts"] if c["name"] == current)
        cluster = next(c["cluster"] for c in config["clusters"] if c["name"] == context["cluster"])
        user = next(u["user"] for u in config["users"] if u["name"] == context["user"])
        self.server = cluster["server"].rstrip("/")
        self.tmp = tempfile.mkdtemp(prefix="kube-apply-")
        self.ctx = ssl.create_default_context(cafile=self._file(cluster, "certificate-authority"))
        self.token = user.get("token")
        if "client-certificate-data" in user or "client-certificate" in user:
            self.ctx.load_cert_chain(self._file(user, "client-certificate"), self._file(user, "client-key"))
        self.warnings = []
        self._resources = {}

    def _file(self, block, key):
        if f"{key}-data" in block:
            path = os.path.join(self.tmp, key)
            with open(path, "wb") as f:
                f.write(base64.b64decode(block[f"{key}-data"]))
            return path
        return block[key]

    def request(self, method, path, body=None, content_type="application/json"):
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.server + path, data=data, method=method)
        if data is not None:
            req.add_header("Content-Type", content_type)
        if self.token:
            req.add_header("Authorization", f"Bearer {self.token}")
        try:
            with urllib.request.urlopen(req, context=self.ctx, timeout=30) as resp:
                self._warn(method, path, resp.headers)
                return resp.status, json.loads(resp.read() or b"{}")
        except urllib.error.HTTPError as err:
            self._warn(method, path, err.headers)
            text = err.read().decode(errors="replace")
            try:
                return err.code, json.loads(text)
            except ValueError:
                return err.code, {"message": text}

    def _warn(self, method, path, headers):
        for w in headers.get_all("Warning") or []:
            self.warnings.append((f"{method} {path.split('?')[0]}", w))

    def take_warnings(self):
        w, self.warnings = self.warnings, []
        return w

    def resource(self, api_version, kind):
        """(plural, namespaced) of a kind, from the API server's discovery."""
        key = (api_version, kind)
        if key not in self._resources:
            base = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
            code, body = self.request("GET", base)
            if code != 200:
                fail(f"the API server does not serve {api_version} (HTTP {code}); is its CRD installed?")
            for r in body.get("resources", []):
                if "/" not in r["name"]:
                    self._resources[(api_version, r["kind"])] = (r["name"], r["namespaced"])
            if key not in self._resources:
                fail(f"the API server serves {api_version} but not kind {kind}")
        return self._resources[key]

    def path(self, doc, namespace=None, name=True):
        api_version, kind = doc["apiVersion"], doc["kind"]
        plural, namespaced = self.resource(api_version, kind)
        base = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
        if namespaced:
            ns = doc.get("metadata", {}).get("namespace") or namespace
            if not ns:
                fail(f"{kind} {doc['metadata'].get('name')} is namespaced but has no namespace")
            base += f"/namespaces/{ns}"
        base += f"/{plural}"
        return f"{base}/{doc['metadata']['name']}" if name else base


def apply(client, doc, namespace=None, dry_run=False):
    query = {"fieldManager": FIELD_MANAGER, "force": "true", "fieldValidation": "Strict"}
    if dry_run:
        query["dryRun"] = "All"
    path = client.path(doc, namespace) + "?" + urllib.parse.urlencode(query)
    code, body = client.request("PATCH", path, doc, "application/apply-patch+yaml")
    return code, body


def must_apply(client, doc, namespace=None):
    code, body = apply(client, doc, namespace)
    what = f"{doc['kind']} {doc['metadata']['name']}"
    if code >= 300:
        fail(f"applying {what}: HTTP {code}: {body.get('message')}")
    return what


def check_no_warnings(client, context):
    warnings = client.take_warnings()
    if warnings:
        for where, w in warnings:
            print(f"[kube-apply] warning on {where}: {w}", file=sys.stderr)
        fail(f"{len(warnings)} warning(s) from the API server {context}")


def cmd_namespace(client, name):
    doc = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": PSS_LABELS}}
    must_apply(client, doc)
    check_no_warnings(client, f"creating namespace {name}")
    log(f"namespace {name} enforces, warns and audits the restricted Pod Security Standard")


def cmd_crds(client, *paths, timeout=60):
    names = [must_apply(client, doc).split(" ", 1)[1] for doc in documents(paths)]
    check_no_warnings(client, "applying CRDs")
    pending = wait_established(client, names, timeout)
    if pending:
        fail(f"CRDs not Established within {timeout}s: {', '.join(sorted(pending))}")
    log(f"{len(names)} CRD(s) Established: {', '.join(names)}")


def pod_from(deployment, namespace):
    template = deployment["spec"]["template"]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        # A short name: a Pod's name becomes its hostname, and longer ones draw a warning.
        "metadata": {"name": "pss-probe", "namespace": namespace,
                     "labels": template.get("metadata", {}).get("labels", {})},
        "spec": copy.deepcopy(template["spec"]),
    }


def create_pod_dry_run(client, pod):
    path = client.path(pod, name=False) + "?dryRun=All&fieldValidation=Strict"
    return client.request("POST", path, pod)


def cmd_apply(client, namespace, *paths):
    docs = list(documents(paths))
    # Kinds the others depend on first, as helm install does.
    order = {"Namespace": 0, "CustomResourceDefinition": 0, "ServiceAccount": 1, "ClusterRole": 2,
             "Role": 2, "ClusterRoleBinding": 3, "RoleBinding": 3, "Service": 4}
    docs.sort(key=lambda d: order.get(d["kind"], 5))
    # A dry run of everything first, so that objects drawing a warning are never stored.
    for doc in docs:
        code, body = apply(client, doc, namespace, dry_run=True)
        if code >= 300:
            fail(f"applying {doc['kind']} {doc['metadata']['name']} (dry run): HTTP {code}: {body.get('message')}")
    check_no_warnings(client, f"applying {len(docs)} objects to {namespace} (dry run)")
    applied = [must_apply(client, doc, namespace) for doc in docs]
    check_no_warnings(client, f"applying {len(docs)} objects to {namespace}")
    log(f"applied without warnings: {', '.join(applied)}")
    deployments = [d for d in docs if d["kind"] == "Deployment"]
    for d in deployments:
        pod = pod_from(d, d["metadata"].get("namespace") or namespace)
        code, body = create_pod_dry_run(client, pod)
        if code >= 300:
            fail(f"a Pod from Deployment {d['metadata']['name']}'s template is refused: HTTP {code}: {body.get('message')}")
        check_no_warnings(client, f"creating a Pod from Deployment {d['metadata']['name']}'s template")
        log(f"a Pod from Deployment {d['metadata']['name']}'s template passes PodSecurity enforce=restricted (dry run)")
    if not deployments:
        fail("no Deployment among the objects: nothing was checked against the Pod Security Standard")


def cmd_pss_controls(client, namespace):
    """The checks above mean something only if this namespace's PodSecurity admission bites."""
    container = {"name": "c", "image": "registry.example.com/x:1",
                 "securityContext": {"allowPrivilegeEscalation": True}}
    deployment = {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "chart-pss-control", "namespace": namespace},
        "spec": {"selector": {"matchLabels": {"app": "pss-control"}},
                 "template": {"metadata": {"labels": {"app": "pss-control"}},
                              "spec": {"containers": [container]}}},
    }
    code, body = apply(client, deployment, namespace, dry_run=True)
    warnings = client.take_warnings()
    if code >= 300:
        fail(f"control Deployment refused: HTTP {code}: {body.get('message')}")
    if not any("restricted" in w for _, w in warnings):
        fail(f"a Deployment violating the restricted standard drew no warning in {namespace}: {warnings}")
    code, body = create_pod_dry_run(client, pod_from(deployment, namespace))
    client.take_warnings()
    if code != 403 or "violates PodSecurity" not in body.get("message", ""):
        fail(f"a Pod violating the restricted standard was not refused in {namespace}: HTTP {code}: {body.get('message')}")
    log(f"control: in {namespace}, a violating Deployment draws warnings and its Pod is refused (403)")


def main(argv):
    if len(argv) < 3:
        fail(__doc__)
    client = Client(argv[1])
    cmd, args = argv[2], argv[3:]
    commands = {"namespace": cmd_namespace, "crds": cmd_crds, "apply": cmd_apply,
                "pss-controls": cmd_pss_controls}
    if cmd not in commands:
        fail(f"unknown command {cmd}")
    commands[cmd](client, *args)


if __name__ == "__main__":
    main(sys.argv)
