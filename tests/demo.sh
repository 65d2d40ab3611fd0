#!/usr/bin/env bash
# Starts the local control plane (building it on first use) and runs the demo against it.
# The control plane keeps running afterwards so you can look around; `make down` stops it.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash tests/control-plane/control-plane.sh start
cargo run --quiet --locked -p e2e --bin demo
