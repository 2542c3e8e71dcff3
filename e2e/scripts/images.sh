#!/usr/bin/env bash
# hangar's images without a Docker engine.
#
#   images.sh build            static (musl) binaries for linux/amd64 and
#                              linux/arm64, cargo profile `image`
#   images.sh push REGISTRY    each binary packed from scratch into an OCI
#                              image by crane (go-containerregistry, built by
#                              build-binaries.sh), the two platforms joined
#                              into one multi-platform index, pushed to
#                              REGISTRY/hangar/<image>; plain HTTP, so
#                              REGISTRY is a loopback one
#
# `push` prints "<image> <REGISTRY>/hangar/<image>@<index digest>" per image
# on stdout (what the chart's image.digests take); progress on stderr. The
# packing is reproducible (root-owned files, one fixed time, sorted, no
# creation time in the config), so a build's digests are the same wherever
# it is pushed.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
CACHE="${HANGAR_CACHE:-$HOME/.cache/hangar}"
# A target directory of its own: nothing is shared with the host build
# (other targets, another profile), and a build here never waits on the
# lock of a `cargo test` running in the other.
export CARGO_TARGET_DIR="$CACHE/target-images"
log() { printf '[images] %s\n' "$*" >&2; }

# image name -> binary
declare -A images=(
  [operator]=hangar-operator
  [webhook]=hangar-webhook
  [gateway]=hangar-gateway
  [worker]=hangar-worker
  [supervisor]=hangar-supervisor
)
# Rust target -> OCI platform.
declare -A platforms=([x86_64-unknown-linux-musl]=linux/amd64 [aarch64-unknown-linux-musl]=linux/arm64)

# The C compilers for the crates with C code (ring, aws-lc-sys), compiling
# against musl's headers: Debian's musl-gcc for amd64, and for arm64 the
# cross gcc with the specs of Debian's musl-dev:arm64 (a wrapper, since a
# compiler named by CC_<target> cannot carry flags everywhere it is read).
cross_compilers() {
  local dir="$CACHE/toolchain"
  mkdir -p "$dir"
  cat >"$dir/aarch64-linux-musl-gcc.tmp" <<'SH'
#!/bin/sh
exec aarch64-linux-gnu-gcc -specs /usr/lib/aarch64-linux-musl/musl-gcc.specs "$@"
SH
  chmod +x "$dir/aarch64-linux-musl-gcc.tmp"
  mv "$dir/aarch64-linux-musl-gcc.tmp" "$dir/aarch64-linux-musl-gcc"
  export CC_x86_64_unknown_linux_musl=musl-gcc
  export CC_aarch64_unknown_linux_musl="$dir/aarch64-linux-musl-gcc"
  export AR_aarch64_unknown_linux_musl=aarch64-linux-gnu-ar
  # Rust's musl targets bring their own crt objects and libc; gcc only links.
  export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_MUSL_LINKER=aarch64-linux-gnu-gcc
}

build() {
  for tool in musl-gcc aarch64-linux-gnu-gcc; do
    command -v "$tool" >/dev/null || { log "$tool is missing (e2e/scripts/system-packages.sh installs it)"; exit 1; }
  done
  [[ -f /usr/lib/aarch64-linux-musl/musl-gcc.specs ]] ||
    { log "musl-dev:arm64 is missing (e2e/scripts/system-packages.sh installs it)"; exit 1; }
  cross_compilers
  local installed target
  installed=$(rustup target list --installed)
  for target in "${!platforms[@]}"; do
    grep -qx "$target" <<<"$installed" || { log "rustup target add $target"; rustup target add "$target" >&2; }
  done
  local bins=()
  for b in "${images[@]}"; do bins+=(--bin "$b"); done
  for target in $(printf '%s\n' "${!platforms[@]}" | sort); do
    log "cargo build --profile image --target $target (${images[*]})"
    local start=$SECONDS
    (cd "$root" && cargo build --profile image --target "$target" "${bins[@]}" >&2)
    log "built $target in $((SECONDS - start))s"
  done
}

# Debian's ca-certificates bundle (system-packages.sh installs it).
CA_BUNDLE=/etc/ssl/certs/ca-certificates.crt

push() {
  local registry=$1
  [[ -s $CA_BUNDLE ]] || { log "$CA_BUNDLE is missing (e2e/scripts/system-packages.sh installs ca-certificates)"; exit 1; }
  local bin crane
  bin=$("$here/build-binaries.sh" crane)
  crane="$bin/crane-$(sed -n 's/^GGCR_VERSION=//p' "$root/e2e/versions.env")"
  local tag
  tag=$(cd "$root" && git describe --always --dirty 2>/dev/null || echo dev)
  local work
  work=$(mktemp -d)
  # shellcheck disable=SC2064
  trap "rm -rf '$work'" EXIT
  local image target
  for image in $(printf '%s\n' "${!images[@]}" | sort); do
    local b=${images[$image]} refs=()
    for target in $(printf '%s\n' "${!platforms[@]}" | sort); do
      local platform=${platforms[$target]}
      local built="$CARGO_TARGET_DIR/$target/image/$b"
      [[ -x "$built" ]] || { log "$built is missing: run images.sh build (make test does)"; exit 1; }
      local tree="$work/$image-${platform//\//-}" layer="$work/$image-${platform//\//-}.tar"
      mkdir -p "$tree/usr/local/bin" "$tree/etc/ssl/certs"
      cp "$built" "$tree/usr/local/bin/$b"
      chmod 0755 "$tree/usr/local/bin/$b"
      # The CA store: the clients that verify public servers (EC2, S3, a
      # registry) read it where rustls-native-certs looks on Linux; a
      # scratch image without one makes them fail to build at all.
      install -m 0644 "$CA_BUNDLE" "$tree/etc/ssl/certs/ca-certificates.crt"
      tar --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 -C "$tree" -cf "$layer" etc usr
      local ref="$registry/hangar/$image:$tag-${platform//\//-}"
      "$crane" append --insecure --oci-empty-base -f "$layer" -t "$ref" >/dev/null
      # Non-root by default; the worker's DaemonSet asks for root itself.
      "$crane" mutate --insecure "$ref" --set-platform "$platform" --entrypoint "/usr/local/bin/$b" \
        --user 65532:65532 -t "$ref" >/dev/null
      # The one layer's compressed size (the last "size" of the manifest).
      local compressed
      compressed=$("$crane" manifest --insecure "$ref" | grep -o '"size":[0-9]*' | tail -n1 | cut -d: -f2)
      log "$image $platform: binary $(($(stat -c %s "$built") / 1024)) KiB, layer $((compressed / 1024)) KiB compressed"
      refs+=(-m "$ref")
    done
    local index="$registry/hangar/$image:$tag"
    "$crane" index append --insecure "${refs[@]}" -t "$index" >/dev/null
    local digest
    digest=$("$crane" digest --insecure "$index")
    log "$image: $index@$digest"
    echo "$image $registry/hangar/$image@$digest"
  done
}

case "${1:-}" in
  build) build ;;
  push) push "${2:?usage: images.sh push REGISTRY}" ;;
  *) echo "usage: images.sh build | images.sh push REGISTRY" >&2; exit 2 ;;
esac
