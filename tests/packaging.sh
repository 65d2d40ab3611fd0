#!/usr/bin/env bash
# What a crates.io release needs, proven from the checkout: the dependency licenses, the
# published crates packaged and built from their packages alone, the library's docs built as
# docs.rs builds them, and the whole workspace on the declared minimum Rust version.
# Installs what it lacks (cargo-deny from crates.io, the MSRV toolchain by rustup).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
step() { printf '\n=== %s\n' "$*"; }
published=(kueue-admission-sdk kueue-provisioning-controller kueue-capacity-buffer-controller)
# Pinned so a new cargo-deny release cannot change what passes; --locked builds it with the
# dependency versions its authors tested.
cargo_deny_version=0.20.2

step "every crate published or linked has a publish decision"
# A crate without publish = false would go to crates.io by accident; the published ones need
# the metadata crates.io shows.
python3 - "${published[@]}" <<'EOF'
import json, subprocess, sys
published = set(sys.argv[1:])
meta = json.loads(subprocess.check_output(
    ["cargo", "metadata", "--format-version", "1", "--no-deps", "--locked"]))
failures = []
for pkg in meta["packages"]:
    name, is_published = pkg["name"], pkg["publish"] != []
    if is_published != (name in published):
        failures.append(f"{name}: publish is {pkg['publish']!r}, expected "
                        f"{'allowed' if name in published else 'false'}")
    if name in published:
        for field in ("description", "license", "repository", "readme", "rust_version"):
            if not pkg.get(field):
                failures.append(f"{name}: no {field} in its manifest")
        for field in ("keywords", "categories"):
            if not pkg.get(field):
                failures.append(f"{name}: no {field} in its manifest")
if failures:
    sys.exit("manifest problems:\n  " + "\n  ".join(failures))
print(f"published: {sorted(published)}; every other crate has publish = false")
EOF

step "dependency licenses (cargo deny check licenses, deny.toml)"
if ! cargo deny --version 2>/dev/null | grep -qF "$cargo_deny_version"; then
  echo "installing cargo-deny $cargo_deny_version from crates.io"
  cargo install --locked --quiet cargo-deny --version "$cargo_deny_version"
fi
cargo deny --locked check licenses

step "cargo package: ${published[*]}, each built from its package"
# Packaged together; then built from the packages alone, as crates.io users get them, the
# controller against the packaged SDK (cargo's own verification cannot build the SDK: a library
# names no Kubernetes version for k8s-openapi, its users' binaries do).
package_args=()
for crate in "${published[@]}"; do package_args+=(-p "$crate"); done
cargo package --locked --no-verify "${package_args[@]}"
verify="target/package-verify"
rm -rf "$verify"; mkdir -p "$verify"
members=()
for crate in "${published[@]}"; do
  file="$(ls target/package/"$crate"-*.crate)"
  tar -xzf "$file" -C "$verify"
  members+=("\"$(basename "$file" .crate)\"")
done
sdk_dir="$(basename "$(ls target/package/kueue-admission-sdk-*.crate)" .crate)"
{
  printf '[workspace]\nresolver = "3"\nmembers = [%s]\n\n' "$(IFS=,; echo "${members[*]}")"
  printf '[patch.crates-io]\nkueue-admission-sdk = { path = "%s" }\n' "$sdk_dir"
} >"$verify/Cargo.toml"
# The workspace's lock pins the same dependency versions CI tested.
cp Cargo.lock "$verify/Cargo.lock"
# The workspace's target directory: dependencies built before are reused.
repo="$PWD"
(cd "$verify" && cargo build --quiet --workspace --target-dir "$repo/target")
echo "built from their packages: ${published[*]}"

step "docs as docs.rs builds them (the SDK alone, its docs.rs features, warnings are errors)"
# The library alone: no other workspace crate picks a Kubernetes version for it here.
features=$(python3 -c '
import json, subprocess
meta = json.loads(subprocess.check_output(["cargo", "metadata", "--format-version", "1", "--no-deps", "--locked"]))
sdk = next(p for p in meta["packages"] if p["name"] == "kueue-admission-sdk")
# [package.metadata.docs.rs] reads back as {"docs": {"rs": ...}}.
print(",".join(sdk["metadata"]["docs"]["rs"]["features"]))')
RUSTDOCFLAGS="--cfg docsrs -D warnings" cargo doc --locked --quiet --no-deps \
  -p kueue-admission-sdk --features "$features" --target-dir target/docsrs

step "the declared minimum Rust version"
msrv=$(sed -n 's/^rust-version = "\(.*\)"/\1/p' Cargo.toml)
[[ -n $msrv ]] || { echo "no rust-version in the workspace Cargo.toml"; exit 1; }
command -v rustup >/dev/null || { echo "rustup is required to build on the MSRV $msrv"; exit 1; }
rustup toolchain list | grep -q "^$msrv" || rustup toolchain install "$msrv" --profile minimal
cargo "+$msrv" check --locked --workspace --all-targets --target-dir target/msrv
echo "the workspace builds on Rust $msrv"
