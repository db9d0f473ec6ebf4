# syntax=docker/dockerfile:1
#
# rebound container image.
#
#   docker build -t rebound:0.1.0 .
#   docker run --rm -p 127.0.0.1:8080:8080 -p 127.0.0.1:9901:9901 \
#     -e REBOUND_LISTEN=0.0.0.0:8080 -e OPENAI_API_KEY rebound:0.1.0
#
# Runtime: distroless "cc" (glibc, libgcc, CA certificates; no shell, no package manager),
# user 65532:65532. The config is read from /etc/rebound/rebound.toml (REBOUND_CONFIG); the
# image ships config/rebound.toml there, mount your own over it (Kubernetes: a ConfigMap).
# Ports: 8080 the proxy, 9901 admin (/metrics, /healthz, /readyz). The proxy listens on
# 127.0.0.1 unless REBOUND_LISTEN says otherwise (a pod's app reaches it on localhost); the
# admin port listens on all interfaces so that kubelet probes and Prometheus reach it.
# No HEALTHCHECK: orchestrators probe /healthz and /readyz on the admin port.
#
# The build commands below are run by tests/deploy/test_dockerfile.py on every CI run, and the
# Rust and Debian versions are checked against the toolchain CI builds with: keep them in step.

ARG RUST_VERSION=1.95

FROM docker.io/library/rust:${RUST_VERSION}-slim-bookworm AS build
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
COPY src/ src/
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target,sharing=locked \
    cargo build --release --locked \
    && install -D -m 0755 target/release/rebound /out/rebound

FROM gcr.io/distroless/cc-debian12:nonroot
LABEL org.opencontainers.image.title="rebound" \
      org.opencontainers.image.description="Egress sidecar for LLM and API providers: retries, Retry-After, circuit breaking, idempotency, metrics" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=build /out/rebound /usr/local/bin/rebound
COPY config/rebound.toml /etc/rebound/rebound.toml
ENV REBOUND_CONFIG=/etc/rebound/rebound.toml \
    REBOUND_ADMIN_LISTEN=0.0.0.0:9901
USER 65532:65532
EXPOSE 8080 9901
STOPSIGNAL SIGTERM
ENTRYPOINT ["/usr/local/bin/rebound"]
