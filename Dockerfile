# Both binaries in one minimal image: build with the Rust toolchain, run on distroless
# (no shell, non-root). The Deployment in manifests/ runs /status-applier and
# /capt-controller from it. Build, push and name it for both install paths with
#   hack/image.sh [--push] [--set] IMAGE          (docs/operating.md, "The image")
# The toolchain: a stable Rust at least the workspace's rust-version (Cargo.toml, as the
# README says; tests/tests/doc_names.rs checks it), the one CI uses.
FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked -p status-applier -p capt-controller --bins \
 && cp target/release/status-applier target/release/capt-controller /

FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /status-applier /capt-controller /
USER 65532:65532
ENTRYPOINT ["/capt-controller"]
