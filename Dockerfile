# syntax=docker/dockerfile:1
#
# A small static image of a check controller of this workspace, running as non-root.
#
#   docker build -t kueue-provisioning-controller:0.1.0 .
#   docker build --build-arg PACKAGE=budget-check --build-arg BIN=budget-check -t budget-check:0.1.0 .
#
# Stage 1 builds the binary statically linked (glibc's static libc, `+crt-static`), stripped;
# stage 2 copies only that binary onto distroless/static (no shell, no package manager, no libc:
# CA certificates, /etc/passwd with the nonroot user 65532, and tzdata). In a pod the controller
# trusts the ServiceAccount's ca.crt; the system CA certificates serve only a kubeconfig that
# names no certificate authority.
#
# CI cannot run docker; tests/helm/static-binary.sh builds the same binary with the same flags and
# checks that it is static, within its size budget, and that it starts.

ARG RUST_VERSION=1.95
ARG BASE_IMAGE=gcr.io/distroless/static-debian12:nonroot

FROM docker.io/library/rust:${RUST_VERSION}-bookworm AS build
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
ARG PACKAGE=kueue-provisioning-controller
ARG BIN=kueue-provisioning-controller
WORKDIR /src
COPY . .
# The host triple is passed as --target so that RUSTFLAGS apply to the binary only, not to the
# build scripts and proc-macros (which cannot be static). Same on amd64 and arm64 builders.
# getrandom_backend="linux_getrandom": getrandom finds glibc's getrandom() through dlsym, which a
# static binary cannot do, and would fall back to reading /dev/urandom; this calls it directly, so
# the binary needs no file at all. A dynamic binary (an ELF interpreter or a needed shared
# library) would not start on distroless/static: the build refuses it.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    set -eu; \
    triple="$(rustc -vV | sed -n 's/^host: //p')"; \
    RUSTFLAGS='-C target-feature=+crt-static --cfg getrandom_backend="linux_getrandom"' \
      CARGO_PROFILE_RELEASE_STRIP=symbols \
      cargo build --release --locked -p "$PACKAGE" --bin "$BIN" --target "$triple"; \
    install -D -m 0755 "target/$triple/release/$BIN" /out/controller; \
    dynamic="$(readelf -lW -dW /out/controller | grep -cE 'INTERP|NEEDED' || true)"; \
    if [ "$dynamic" != 0 ]; then \
      echo "$BIN is not statically linked" >&2; exit 1; \
    fi; \
    /out/controller --version

FROM ${BASE_IMAGE}
ARG BIN=kueue-provisioning-controller
LABEL org.opencontainers.image.title="${BIN}" \
      org.opencontainers.image.description="Kueue admission check controller built with kueue-admission-sdk" \
      org.opencontainers.image.source="https://github.com/kueue-admission-checks/kueue-admission-checks" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=build /out/controller /controller
# Numeric, so that the kubelet can verify runAsNonRoot without reading /etc/passwd.
USER 65532:65532
# /metrics over HTTPS (--metrics-address, default 0.0.0.0:8443); /healthz and /readyz, plain
# (--health-address, default 0.0.0.0:8081).
EXPOSE 8443 8081
ENTRYPOINT ["/controller"]
