"""What the chart checks (check_rendered.py, check_observability.py) failed, collected so that
one run reports every failure, and how a check ends."""
import sys

failures = []


def check(cond, msg):
    """Records `msg` as a failure unless `cond`; returns `cond`."""
    if not cond:
        failures.append(msg)
    return cond


def finish(where, ok):
    """Prints every failure, each after `where`, and exits 1; else prints `ok`."""
    if failures:
        for f in failures:
            print(f"[chart] {where}{f}", file=sys.stderr)
        sys.exit(1)
    print(f"[chart] {where}{ok}", file=sys.stderr)
