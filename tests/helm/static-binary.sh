#!/usr/bin/env bash
# Builds the binary the container image contains (see Dockerfile) the same way, without docker,
# and checks what the image relies on:
#   - it is statically linked (no ELF interpreter, no needed shared library);
#   - it fits the size budget;
#   - it starts: --help, --version; an unusable kubeconfig exits 1 with the reason;
#   - run as uid 65532 in an empty root directory (what distroless/static gives it: when this
#     script runs as root, through chroot), it still starts, and against the local control
#     plane (when it runs) it becomes ready and stops cleanly on SIGTERM.
#
# With the argument `build`, only builds.
#
# Settings (environment): STATIC_TARGET_DIR (default target/static, so a release build never
# waits on the debug build's lock), STATIC_BINARY_BUDGET_MIB (default 24), STATIC_BINARY_OFFLINE=1
# (leave out the run against the control plane).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
log() { printf '[static-binary] %s\n' "$*" >&2; }
die() { printf '[static-binary] error: %s\n' "$*" >&2; exit 1; }

PACKAGE=kueue-provisioning-controller
BIN=kueue-provisioning-controller
# 16.0 MiB measured (Rust 1.95, kube 5, release profile, stripped); the budget leaves 50% headroom.
BUDGET_MIB="${STATIC_BINARY_BUDGET_MIB:-24}"
target_dir="${STATIC_TARGET_DIR:-target/static}"
triple="$(rustc -vV | sed -n 's/^host: //p')"
[[ $triple == *-linux-gnu ]] || die "expected a linux-gnu host, got $triple"

# --- build, exactly as the Dockerfile does -------------------------------------------------------
t=$SECONDS
log "cargo build --release $BIN for $triple with +crt-static (target dir $target_dir)"
# getrandom_backend: see the Dockerfile (without it, randomness would come from /dev/urandom).
RUSTFLAGS='-C target-feature=+crt-static --cfg getrandom_backend="linux_getrandom"' \
  CARGO_PROFILE_RELEASE_STRIP=symbols CARGO_TARGET_DIR="$target_dir" \
  cargo build --release --locked --quiet -p "$PACKAGE" --bin "$BIN" --target "$triple"
bin="$target_dir/$triple/release/$BIN"
[[ -x $bin ]] || die "no binary at $bin"
log "built in $((SECONDS - t))s: $bin"
# `static-binary.sh build` only builds (run-all.sh starts it early, beside other builds).
[[ ${1:-} == build ]] && exit 0

# --- static ----------------------------------------------------------------------------------------
# (Captured first: `readelf | grep -q` under pipefail could fail on SIGPIPE and hide a match.)
headers="$(readelf -lW "$bin")"; dynamic="$(readelf -dW "$bin")"
if grep -q 'INTERP' <<<"$headers"; then die "$bin has an ELF interpreter: it is dynamically linked"; fi
if needed="$(grep 'NEEDED' <<<"$dynamic")"; then die "$bin needs shared libraries: $needed"; fi
command -v file >/dev/null && log "file: $(file -b "$bin")"
log "ldd: $(ldd "$bin" 2>&1 | head -n1 | sed 's/^[[:space:]]*//')"

# --- size ----------------------------------------------------------------------------------------
bytes="$(stat -c %s "$bin")"
mib="$(awk -v b="$bytes" 'BEGIN { printf "%.1f", b / 1048576 }')"
log "size: $bytes bytes ($mib MiB; budget $BUDGET_MIB MiB)"
((bytes <= BUDGET_MIB * 1048576)) || die "$bin is $mib MiB, over the budget of $BUDGET_MIB MiB"

# --- it starts -------------------------------------------------------------------------------------
work="$(mktemp -d "${TMPDIR:-/tmp}/static-binary.XXXXXX")"
pid=""
cleanup() {
  if [[ -n $pid ]] && kill -0 "$pid" 2>/dev/null; then kill -KILL "$pid" 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT

expect() { # description expected-status pattern command...
  local what=$1 want=$2 pattern=$3 out status=0; shift 3
  out="$("$@" 2>&1)" || status=$?
  [[ $status == "$want" ]] || die "$what: exit status $status, expected $want; output:
$out"
  grep -qE -- "$pattern" <<<"$out" || die "$what: output does not match /$pattern/:
$out"
  log "ok: $what (exit $status)"
}

# An empty environment, as in the image: no PATH, HOME or KUBECONFIG.
version="$(sed -n 's/^version = "\(.*\)"/\1/p' provisioning-controller/Cargo.toml | head -n1)"
expect "--help" 0 '--controller-name' env -i "$bin" --help
expect "--version" 0 "^$BIN $version\$" env -i "$bin" --version
expect "missing kubeconfig" 1 'reading kubeconfig' env -i "$bin" --kubeconfig "$work/none" --metrics-address off
printf 'this: [is not a kubeconfig\n' >"$work/garbage.kubeconfig"
expect "malformed kubeconfig" 1 'kubeconfig' env -i "$bin" --kubeconfig "$work/garbage.kubeconfig" --metrics-address off
expect "no kubeconfig, not in a cluster" 1 'not in a cluster' env -i "$bin" --metrics-address off
expect "malformed flag" 2 'invalid value' env -i "$bin" --concurrency 0

# In an empty root directory as uid 65532, like distroless/static (which adds only CA
# certificates, tzdata and /etc/passwd, none of which the controller reads), and stricter than a
# container: not even /dev.
if [[ $(id -u) != 0 ]]; then
  log "not root: cannot chroot, so the empty-root checks run the binary in place"
  root=""; run_as=(env -i); inside() { echo "$1"; }
else
  root="$work/root"
  mkdir -p "$root/tmp"
  cp "$bin" "$root/controller"
  chmod 0755 "$root" "$root/controller"; chmod 1777 "$root/tmp"
  chroot_bin="$(command -v chroot)" || die "chroot (coreutils) is required when running as root"
  # An array, not a function: started in the background, $! must be the controller itself
  # (env and chroot exec it), so that SIGTERM reaches it.
  run_as=(env -i "$chroot_bin" --userspec=65532:65532 "$root")
  inside() { echo "${1#"$root"}"; }
fi
exe="$([[ -n $root ]] && echo /controller || echo "$bin")"
expect "--version as uid 65532 in an empty root" 0 "^$BIN $version\$" "${run_as[@]}" "$exe" --version
# A reachable address where nothing listens: the first API call (discovery: is Kueue's API
# served?) fails, the reason is logged and the replica keeps trying (an API server
# restarting must not crash-loop the controllers), until SIGTERM stops it cleanly. The
# kubeconfig names a CA, as a real one does (without one the client wants the system's CA
# certificates, which distroless/static has and the empty root has not).
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj /CN=static-binary-test \
  -days 1 -keyout "$work/ca.key" -out "$work/ca.crt" 2>/dev/null || die "openssl could not make a test CA"
{
  printf 'apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: "https://127.0.0.1:9"\n'
  printf '    certificate-authority-data: %s\n' "$(base64 -w0 <"$work/ca.crt")"
  printf 'contexts:\n- name: c\n  context: {cluster: c, user: u}\ncurrent-context: c\nusers:\n- name: u\n  user: {token: x}\n'
} >"${root:-$work}/tmp/refused.kubeconfig"
chmod 0644 "${root:-$work}/tmp/refused.kubeconfig"
unreachable="$work/unreachable.log"
"${run_as[@]}" "$exe" --kubeconfig "$(inside "${root:-$work}/tmp/refused.kubeconfig")" --metrics-address off \
  --health-address off --leader-election-namespace default --log-format json >"$unreachable" 2>&1 &
pid=$!
# Its first call, before any watch or the election, asks discovery whether Kueue's API is served.
waiting='cannot read the API discovery yet'
for ((i = 0; i < 100; i++)); do
  grep -q "$waiting" "$unreachable" && break
  kill -0 "$pid" 2>/dev/null || { cat "$unreachable" >&2; die "unreachable API server: the controller exited instead of waiting"; }
  sleep 0.2
done
grep -q "$waiting" "$unreachable" ||
  { cat "$unreachable" >&2; die "unreachable API server: no retry logged within 20 s"; }
grep -qiE 'connect|refused' "$unreachable" || { cat "$unreachable" >&2; die "unreachable API server: the log does not say why"; }
kill -TERM "$pid"
status=0; wait "$pid" || status=$?
pid=""
[[ $status == 0 ]] || { cat "$unreachable" >&2; die "unreachable API server: exit status $status after SIGTERM, expected 0"; }
log "ok: unreachable API server: logs why, keeps trying, stops cleanly on SIGTERM (exit 0)"

# Against the local control plane (required, as for every end-to-end test; STATIC_BINARY_OFFLINE=1
# leaves this part out for a quick run without it): ready, then a clean stop. A controller name no
# AdmissionCheck uses, so that it answers nothing while other tests share the control plane.
cp_sh=tests/control-plane/control-plane.sh
if [[ ${STATIC_BINARY_OFFLINE:-0} == 1 ]]; then
  log "STATIC_BINARY_OFFLINE=1: not run against the local control plane"
elif ! bash "$cp_sh" status >/dev/null 2>&1; then
  die "the local control plane is not running: start it ($cp_sh start), or set STATIC_BINARY_OFFLINE=1"
else
  eval "$(bash "$cp_sh" env)"
  kc="${root:-$work}/tmp/admin.kubeconfig"
  install -m 0600 "$KUBECONFIG" "$kc"
  [[ -n $root ]] && chown 65532:65532 "$kc"
  free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
  port="$(free_port)"
  # The probes and plain metrics on one port; the default (HTTPS, authenticated) below.
  "${run_as[@]}" "$exe" --kubeconfig "$(inside "$kc")" --leader-elect=false --metrics-address "127.0.0.1:$port" \
    --metrics-secure=false --health-address "127.0.0.1:$port" \
    --controller-name chart-static-binary.kueue-admission-checks.dev/none --log-format json \
    >"$work/run.log" 2>&1 &
  pid=$!
  for ((i = 0; i < 150; i++)); do
    curl -sf "http://127.0.0.1:$port/readyz" >/dev/null 2>&1 && break
    kill -0 "$pid" 2>/dev/null || { cat "$work/run.log" >&2; die "the static binary exited against the control plane"; }
    sleep 0.2
  done
  curl -sf "http://127.0.0.1:$port/readyz" >/dev/null || { cat "$work/run.log" >&2; die "not ready after 30s"; }
  curl -sf "http://127.0.0.1:$port/metrics" | grep -q '^kueue_ac_leader 1' ||
    die "/metrics does not report kueue_ac_leader 1"
  log "ok: ready against the local control plane (TLS, watches, /readyz, /metrics)"
  kill -TERM "$pid"
  status=0; wait "$pid" || status=$?
  pid=""
  [[ $status == 0 ]] || { cat "$work/run.log" >&2; die "exit status $status after SIGTERM, expected 0"; }
  log "ok: clean stop on SIGTERM (exit 0)"
  # The default metrics: HTTPS with a self-signed certificate, a request without a token refused.
  sport="$(free_port)"
  "${run_as[@]}" "$exe" --kubeconfig "$(inside "$kc")" --leader-elect=false --metrics-address "127.0.0.1:$sport" \
    --health-address off --controller-name chart-static-binary.kueue-admission-checks.dev/none --log-format json \
    >"$work/https.log" 2>&1 &
  pid=$!
  code=000
  for ((i = 0; i < 150; i++)); do
    code="$(curl -sk -o /dev/null -w '%{http_code}' "https://127.0.0.1:$sport/metrics" || true)"
    [[ $code != 000 ]] && break
    kill -0 "$pid" 2>/dev/null || { cat "$work/https.log" >&2; die "the static binary exited serving HTTPS metrics"; }
    sleep 0.2
  done
  kill -TERM "$pid"; wait "$pid" || true; pid=""
  [[ $code == 401 ]] || { cat "$work/https.log" >&2; die "HTTPS /metrics without a token answered $code, expected 401"; }
  log "ok: /metrics over HTTPS (self-signed), 401 without a token"
fi
log "static binary OK: $mib MiB"
