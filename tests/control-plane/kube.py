#!/usr/bin/env python3
"""Minimal API-server client for the control-plane script: no kubectl needed.

Only what bringing up the control plane needs: server-side apply of a few cluster-scoped kinds,
waiting for CRDs to be Established, rewriting Kueue's webhook manifest to loopback URLs, minting
ServiceAccount tokens through the TokenRequest API, and the fake nodes' Leases and readiness.
"""
import base64
import json
import os
import ssl
import sys
import time
import urllib.error
import urllib.request

import yaml

FIELD_MANAGER = "kueue-ac-control-plane"
# Cluster-scoped kinds this script applies, by the collection path that serves them.
PATHS = {
    "CustomResourceDefinition": "/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
    "MutatingWebhookConfiguration": "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations",
    "ValidatingWebhookConfiguration": "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations",
    "Namespace": "/api/v1/namespaces",
    "Node": "/api/v1/nodes",
}


class Client:
    def __init__(self):
        pki = os.environ["CP_PKI_DIR"]
        self.server = os.environ["CP_SERVER"]
        self.ctx = ssl.create_default_context(cafile=os.path.join(pki, "ca.crt"))
        self.ctx.load_cert_chain(os.path.join(pki, "admin.crt"), os.path.join(pki, "admin.key"))

    def request(self, method, path, body=None, content_type="application/json"):
        data = None if body is None else body.encode()
        req = urllib.request.Request(self.server + path, data=data, method=method)
        if data is not None:
            req.add_header("Content-Type", content_type)
        try:
            with urllib.request.urlopen(req, context=self.ctx, timeout=30) as resp:
                return resp.status, json.loads(resp.read() or b"{}")
        except urllib.error.HTTPError as err:
            text = err.read().decode(errors="replace")
            try:
                return err.code, json.loads(text)
            except ValueError:
                return err.code, {"message": text}


def fail(msg):
    print(f"[control-plane] error: {msg}", file=sys.stderr)
    sys.exit(1)


def documents(paths):
    for path in paths:
        with open(path) as f:
            for doc in yaml.safe_load_all(f):
                if doc:
                    yield doc


def apply(client, doc):
    kind, name = doc["kind"], doc["metadata"]["name"]
    if kind not in PATHS:
        fail(f"kube.py does not know how to apply kind {kind}")
    path = f"{PATHS[kind]}/{name}?fieldManager={FIELD_MANAGER}&force=true"
    code, body = client.request("PATCH", path, json.dumps(doc), "application/apply-patch+yaml")
    if code >= 300:
        fail(f"applying {kind}/{name}: HTTP {code}: {body.get('message')}")
    return name


def cmd_apply(client, paths):
    for doc in documents(paths):
        apply(client, doc)


def conversion_targets(kustomization_dir):
    """Names of the CRDs that Kueue's CRD kustomization gives a conversion webhook."""
    with open(os.path.join(kustomization_dir, "kustomization.yaml")) as f:
        kustomization = yaml.safe_load(f) or {}
    paths = [os.path.join(kustomization_dir, p["path"]) for p in kustomization.get("patches") or []
             if isinstance(p, dict) and "path" in p]
    return {doc["metadata"]["name"] for doc in documents(paths)
            if (doc.get("spec") or {}).get("conversion", {}).get("strategy") == "Webhook"}


def wait_established(client, names, timeout):
    """Waits until the CRDs `names` are Established; returns those that are not after `timeout`
    seconds. Also used by the chart test's kube_apply.py."""
    deadline = time.monotonic() + timeout
    pending = set(names)
    while pending and time.monotonic() < deadline:
        for name in sorted(pending):
            code, crd = client.request("GET", f"{PATHS['CustomResourceDefinition']}/{name}")
            conds = (crd.get("status") or {}).get("conditions") or []
            if code == 200 and any(c["type"] == "Established" and c["status"] == "True" for c in conds):
                pending.discard(name)
        if pending:
            time.sleep(0.2)
    return pending


def cmd_apply_crds(client, convert_url, ca_file, kustomization_dir, *paths, timeout=60):
    """Applies CRDs, then waits until every one is Established (Kueue checks APIs at start-up).

    CRDs that a real installation gives Kueue's conversion webhook get it here too, by loopback
    URL: without it, a client of a version other than the storage version would see objects
    converted field-blind (strategy None), which no real cluster does.
    """
    converted = conversion_targets(kustomization_dir)
    with open(ca_file, "rb") as f:
        ca_bundle = base64.b64encode(f.read()).decode()
    names = []
    for doc in documents(paths):
        if doc["metadata"]["name"] in converted:
            doc["spec"]["conversion"] = {
                "strategy": "Webhook",
                "webhook": {"clientConfig": {"url": convert_url, "caBundle": ca_bundle},
                            "conversionReviewVersions": ["v1"]},
            }
        names.append(apply(client, doc))
    pending = wait_established(client, names, timeout)
    if pending:
        fail(f"CRDs not Established within {timeout}s: {', '.join(sorted(pending))}")
    print(f"[control-plane] {len(names)} CRDs Established ({len(converted)} with Kueue's conversion webhook)",
          file=sys.stderr)


def cmd_render_webhooks(src, base_url, ca_file, keep_groups):
    """Points Kueue's webhooks at a loopback URL and keeps only the enabled integrations.

    A webhook for a kind whose integration is not enabled would still have failurePolicy Fail and
    block that kind, so it is dropped.
    """
    keep = set(keep_groups.split(","))
    with open(ca_file, "rb") as f:
        ca_bundle = base64.b64encode(f.read()).decode()
    out = []
    for doc in documents([src]):
        kept = []
        for hook in doc.get("webhooks", []):
            groups = {g for rule in hook.get("rules", []) for g in rule.get("apiGroups", [])}
            if not groups <= keep:
                continue
            path = hook["clientConfig"]["service"]["path"]
            hook["clientConfig"] = {"url": base_url + path, "caBundle": ca_bundle}
            kept.append(hook)
        doc["webhooks"] = kept
        out.append(doc)
    yaml.safe_dump_all(out, sys.stdout, sort_keys=False)


def selected_nodes(client, annotation):
    """Nodes carrying annotation `key=value`."""
    key, _, value = annotation.partition("=")
    code, body = client.request("GET", "/api/v1/nodes")
    if code >= 300:
        fail(f"listing nodes: HTTP {code}: {body.get('message')}")
    return [n for n in body.get("items", [])
            if (n["metadata"].get("annotations") or {}).get(key) == value]


def cmd_delete_leases(client, namespace, annotation):
    """Deletes the Leases of the nodes carrying `annotation` (a node's Lease has its name)."""
    for node in selected_nodes(client, annotation):
        name = node["metadata"]["name"]
        code, body = client.request(
            "DELETE", f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/{name}")
        if code >= 300 and code != 404:
            fail(f"deleting Lease {namespace}/{name}: HTTP {code}: {body.get('message')}")


def cmd_nodes(client):
    """One line: each node with its Ready status, or 'none'."""
    code, body = client.request("GET", "/api/v1/nodes")
    if code >= 300:
        fail(f"listing nodes: HTTP {code}: {body.get('message')}")
    words = []
    for node in body.get("items", []):
        ready = next((c["status"] for c in (node.get("status") or {}).get("conditions") or []
                      if c["type"] == "Ready"), "Unknown")
        words.append(f"{node['metadata']['name']} (Ready={ready})")
    print(", ".join(words) or "none")


def cmd_token(client, namespace, sa, seconds):
    body = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
            "spec": {"expirationSeconds": int(seconds)}}
    code, resp = client.request(
        "POST", f"/api/v1/namespaces/{namespace}/serviceaccounts/{sa}/token", json.dumps(body))
    if code >= 300:
        fail(f"TokenRequest for {namespace}/{sa}: HTTP {code}: {resp.get('message')}")
    print(resp["status"]["token"])


def cmd_dry_run_probe(client):
    """Creates a ResourceFlavor with dryRun=All: it passes through Kueue's mutating and validating
    webhooks, so success proves the apiserver can reach them with the CA bundle it was given."""
    body = {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor",
            "metadata": {"name": "control-plane-probe"}}
    code, resp = client.request(
        "POST", "/apis/kueue.x-k8s.io/v1beta2/resourceflavors?dryRun=All", json.dumps(body))
    if code >= 300 and code != 409:
        print(f"webhook probe: HTTP {code}: {resp.get('message')}", file=sys.stderr)
        sys.exit(1)


def main(argv):
    if len(argv) < 2:
        fail("usage: kube.py apply|apply-crds|render-webhooks|token|probe-webhooks|delete-leases|nodes ...")
    cmd, args = argv[1], argv[2:]
    if cmd == "render-webhooks":
        return cmd_render_webhooks(*args)
    client = Client()
    if cmd == "apply":
        return cmd_apply(client, args)
    if cmd == "apply-crds":
        return cmd_apply_crds(client, *args)
    if cmd == "token":
        return cmd_token(client, *args)
    if cmd == "probe-webhooks":
        return cmd_dry_run_probe(client)
    if cmd == "delete-leases":
        return cmd_delete_leases(client, *args)
    if cmd == "nodes":
        return cmd_nodes(client)
    fail(f"unknown command {cmd}")


if __name__ == "__main__":
    main(sys.argv)
