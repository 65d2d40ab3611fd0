#!/usr/bin/env python3
"""Checks the Grafana dashboard and the alert rules against the metrics the code defines.

    check_observability.py --dashboard JSON --rules RENDERED.yaml[,...] --docs docs/operating.md
                           [--require-alerts A,B,...] [--promtool PATH --alerts-test FILE --test-rules RENDERED.yaml]

The metric names, types and labels are read from the code that registers them
(sdk/src/runtime/metrics.rs, provisioning-controller/src/metrics.rs,
capacity-buffer-controller/src/metrics.rs), so a renamed metric fails
here. Then:
  - every PromQL expression of the dashboard (panels and variables) and of every alert uses only
    series that exist (counters end in _total, histograms in _bucket/_sum/_count), label names
    those series have (or that Prometheus adds to a scraped target), and known `state` values;
  - the dashboard shows every metric the code defines, and its panels do not overlap;
  - every alert has a severity, a summary, a description and a runbook_url whose anchor is a
    section of docs/operating.md; the alerts the issue asks for exist;
  - docs/operating.md names every metric the code defines (a new metric needs its line there);
  - with --promtool: every expression parses (`promtool check rules`, the dashboard's as recording
    rules), and the alert unit tests pass (`promtool test rules`).
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

import yaml

from chart_failures import check, failures, finish

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
SOURCES = [
    "sdk/src/runtime/metrics.rs",
    "provisioning-controller/src/metrics.rs",
    "capacity-buffer-controller/src/metrics.rs",
]
# Labels Prometheus (through a ServiceMonitor) adds to every scraped series.
TARGET_LABELS = {"namespace", "pod", "job", "service", "instance", "endpoint", "container"}
STATES = {"Pending", "Ready", "Retry", "Rejected"}
GRAFANA_VARS = {"$__rate_interval": "5m", "$__range": "1h", "$__interval": "1m"}


def metrics_from_code():
    """{family: (type, labels)} from the registrations in the sources."""
    families = {}
    for rel in SOURCES:
        with open(os.path.join(ROOT, rel)) as f:
            src = f.read()
        prefix = re.search(r'sub_registry_with_prefix\("(\w+)"\)', src).group(1)
        label_sets = {m.group(1): set(re.findall(r"(\w+)\s*:\s*String", m.group(2)))
                      for m in re.finditer(r"struct\s+(\w+)\s*\{([^}]*)\}", src)}
        fields = {}
        for m in re.finditer(r"^\s*(\w+)\s*:\s*Family<\s*(\w+)\s*,\s*(Counter|Gauge|Histogram)\b", src, re.M):
            fields[m.group(1)] = (m.group(3).lower(), label_sets[m.group(2)])
        for m in re.finditer(r"^\s*(\w+)\s*:\s*(Counter|Gauge|Histogram)\s*,", src, re.M):
            fields[m.group(1)] = (m.group(2).lower(), set())
        found = 0
        for m in re.finditer(r'\.register\(\s*"(\w+)",\s*"(?:[^"\\]|\\.)*",\s*(?:self\.)?(\w+)\.clone\(\)', src):
            name, var = m.groups()
            if not check(var in fields, f"{rel}: cannot tell the type of {name} (variable {var})"):
                continue
            families[f"{prefix}_{name}"] = fields[var]
            found += 1
        # Collectors: encode_descriptor("name", "help", None, MetricType::X) with the labels they encode.
        for m in re.finditer(r'encode_descriptor\(\s*"(\w+)",\s*"(?:[^"\\]|\\.)*",\s*\w+,\s*[\w:]*MetricType::(\w+)', src):
            labels = set()
            for ls in re.findall(r"let labels = (\w+) \{", src[m.end():]):
                labels |= label_sets.get(ls, set())
            families[f"{prefix}_{m.group(1)}"] = (m.group(2).lower(), labels)
            found += 1
        check(found >= 5, f"{rel}: found only {found} metrics; has the registration code changed shape?")
    return families


def series_names(families):
    """{series name: (family, labels)}."""
    out = {"up": ("up", set())}
    for fam, (kind, labels) in families.items():
        if kind == "counter":
            out[fam + "_total"] = (fam, labels)
        elif kind == "gauge":
            out[fam] = (fam, labels)
        elif kind == "histogram":
            out[fam + "_bucket"] = (fam, labels | {"le"})
            out[fam + "_sum"] = (fam, labels)
            out[fam + "_count"] = (fam, labels)
    return out


def check_expr(where, expr, series):
    """Series, label names and state values of one expression; returns the families it uses."""
    used = set()
    labels_here = set(TARGET_LABELS)
    refs = list(re.finditer(r"\b(kueue_[a-z0-9_]+|up)\b(?!\s*\()\s*(\{[^}]*\})?", expr))
    check(refs, f"{where}: references no metric: {expr}")
    for m in refs:
        name, matchers = m.group(1), m.group(2) or ""
        if not check(name in series, f"{where}: unknown series {name}"):
            continue
        fam, labels = series[name]
        used.add(fam)
        labels_here |= labels
        for label, op, value in re.findall(r'(\w+)\s*(=~|!~|!=|=)\s*"([^"]*)"', matchers):
            check(label in labels | TARGET_LABELS, f"{where}: {name} has no label {label}")
            if label == "state" and op == "=":
                check(value in STATES, f"{where}: state {value!r} is not one of {sorted(STATES)}")
    for group in re.findall(r"\b(?:by|without)\s*\(([^)]*)\)", expr):
        for label in (x.strip() for x in group.split(",") if x.strip()):
            check(label in labels_here, f"{where}: groups by {label}, which none of its series has")
    return used


def grafana_expr(expr):
    for k, v in GRAFANA_VARS.items():
        expr = expr.replace(k, v)
    return re.sub(r"\$\{?\w+\}?", ".*", expr)


def check_dashboard(path, families, series):
    with open(path) as f:
        dash = json.load(f)
    check(dash.get("uid") and dash.get("title"), "dashboard: no uid or title")
    exprs = []
    for v in dash.get("templating", {}).get("list", []):
        if v.get("type") == "query":
            q = v["query"]["query"] if isinstance(v.get("query"), dict) else v.get("query", "")
            m = re.fullmatch(r"label_values\((.*),\s*(\w+)\)", q.strip())
            if check(m, f"dashboard variable {v['name']}: not label_values(selector, label): {q}"):
                exprs.append((f"variable {v['name']}", m.group(1)))
                check(m.group(2) in TARGET_LABELS | {l for _, l in families.values() for l in l},
                      f"dashboard variable {v['name']}: no series has label {m.group(2)}")
    panels = [p for p in dash["panels"] if p["type"] != "row"]
    check(len({p["id"] for p in dash["panels"]}) == len(dash["panels"]), "dashboard: duplicate panel ids")
    cells = {}
    for p in dash["panels"]:
        g = p["gridPos"]
        check(g["x"] + g["w"] <= 24, f"dashboard panel {p['title']!r} is wider than the grid")
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                check((x, y) not in cells, f"dashboard panels {cells.get((x, y))!r} and {p['title']!r} overlap")
                cells[(x, y)] = p["title"]
    for p in panels:
        check(p.get("targets"), f"dashboard panel {p['title']!r} has no query")
        check(p.get("description"), f"dashboard panel {p['title']!r} has no description")
        for t in p.get("targets", []):
            exprs.append((f"panel {p['title']!r} {t['refId']}", t["expr"]))
    used = set()
    for where, e in exprs:
        used |= check_expr(f"dashboard {where}", grafana_expr(e), series)
    for fam in sorted(set(families) - used):
        failures.append(f"dashboard: no panel shows {fam}")
    return [(w, grafana_expr(e)) for w, e in exprs]


def anchors(md_path):
    """GitHub's heading anchors of a Markdown file."""
    out = set()
    with open(md_path) as f:
        for line in f:
            m = re.match(r"^#+\s+(.*?)\s*$", line)
            if m:
                text = re.sub(r"[`*_]", "", m.group(1)).lower()
                out.add(re.sub(r"[^a-z0-9 -]", "", text).replace(" ", "-"))
    return out


def expand_braces(text):
    """`a_{b,c}_d` -> ["a_b_d", "a_c_d"], as the docs write families of counters."""
    m = re.search(r"\{([^{}]*)\}", text)
    if not m:
        return [text]
    return [x for alt in m.group(1).split(",") for x in expand_braces(text[:m.start()] + alt + text[m.end():])]


def check_docs_metrics(docs, families):
    """Every family is named in the docs, by its family or series name."""
    with open(docs) as f:
        text = f.read()
    named = {n for word in re.findall(r"\bkueue_[a-z0-9_{},]*[a-z0-9}]", text) for n in expand_braces(word)}
    for fam, (kind, _) in sorted(families.items()):
        names = {fam, fam + "_total"} if kind == "counter" else {fam}
        check(named & names, f"{docs} does not name the metric {sorted(names)[-1]}: add it to the metrics table")


def check_rules(paths, series, docs, required):
    rule_docs = []
    for path in paths:
        with open(path) as f:
            rule_docs += [d for d in yaml.safe_load_all(f) if d and d.get("kind") == "PrometheusRule"]
    check(rule_docs, f"no PrometheusRule in {paths}")
    sections = anchors(docs)
    names = set()
    for d in rule_docs:
        for g in d["spec"]["groups"]:
            for r in g["rules"]:
                name = r.get("alert") or r.get("record")
                names.add(name)
                check_expr(f"alert {name}", r["expr"], series)
                if "alert" in r:
                    check(r.get("labels", {}).get("severity"), f"alert {name}: no severity label")
                    ann = r.get("annotations", {})
                    for key in ("summary", "description", "runbook_url"):
                        check(ann.get(key), f"alert {name}: no {key}")
                    anchor = ann.get("runbook_url", "").rpartition("#")[2]
                    check(anchor in sections, f"alert {name}: runbook anchor #{anchor} is no section of {docs}")
    for name in required:
        check(name in names, f"missing alert {name}")
    return rule_docs


def run(cmd):
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        failures.append(f"{' '.join(cmd[:3])}... failed:\n{res.stdout}{res.stderr}")
    return res


def promtool_checks(promtool, rule_docs, dash_exprs, alerts_test, test_rules):
    tmp = tempfile.mkdtemp(prefix="promtool-")
    try:
        groups = [g for d in rule_docs for g in d["spec"]["groups"]]
        with open(os.path.join(tmp, "alerts.yaml"), "w") as f:
            yaml.safe_dump({"groups": groups}, f)
        rec = [{"record": f"dashboard:expr_{i}", "expr": e} for i, (_, e) in enumerate(dash_exprs)]
        with open(os.path.join(tmp, "dashboard.yaml"), "w") as f:
            yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rec}]}, f)
        res = run([promtool, "check", "rules", os.path.join(tmp, "alerts.yaml"), os.path.join(tmp, "dashboard.yaml")])
        if res.returncode == 0:
            print(f"[chart] promtool: {sum(len(g['rules']) for g in groups)} alert rules and "
                  f"{len(rec)} dashboard expressions parse", file=sys.stderr)
        if alerts_test:
            with open(test_rules) as f:
                rule = next(d for d in yaml.safe_load_all(f) if d and d.get("kind") == "PrometheusRule")
            with open(os.path.join(tmp, "rules.yaml"), "w") as f:
                yaml.safe_dump({"groups": rule["spec"]["groups"]}, f)
            shutil.copy(alerts_test, os.path.join(tmp, "alerts_test.yaml"))
            res = run([promtool, "test", "rules", os.path.join(tmp, "alerts_test.yaml")])
            if res.returncode == 0:
                with open(alerts_test) as f:
                    n = sum(len(t["alert_rule_test"]) for t in yaml.safe_load(f)["tests"])
                print(f"[chart] promtool: {n} alert unit tests pass", file=sys.stderr)
    finally:
        shutil.rmtree(tmp)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--dashboard", required=True)
    p.add_argument("--rules", required=True, help="rendered chart files with a PrometheusRule, comma-separated")
    p.add_argument("--docs", required=True)
    p.add_argument("--require-alerts", default="")
    p.add_argument("--promtool")
    p.add_argument("--alerts-test")
    p.add_argument("--test-rules", help="the rendering the alert unit tests expect")
    args = p.parse_args()
    families = metrics_from_code()
    series = series_names(families)
    print(f"[chart] {len(families)} metric families in the code: {', '.join(sorted(families))}", file=sys.stderr)
    dash_exprs = check_dashboard(args.dashboard, families, series)
    required = [a for a in args.require_alerts.split(",") if a]
    rule_docs = check_rules(args.rules.split(","), series, args.docs, required)
    check_docs_metrics(args.docs, families)
    if args.promtool:
        promtool_checks(args.promtool, rule_docs, dash_exprs, args.alerts_test, args.test_rules)
    finish("", f"dashboard ({len(dash_exprs)} expressions) and alerts OK")


if __name__ == "__main__":
    main()
