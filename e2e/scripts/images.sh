#!/usr/bin/env bash
# hangar's images without a Docker engine.
#
#   images.sh build [local|release]
#       static (musl) binaries, each stripped into
#       $HANGAR_CACHE/images/<set>/<target>/<binary>:
#       local (the default: `make test`, `make up NODE=real`) cargo's dev
#         profile in the workspace's own target directory (its build
#         scripts and proc-macros are the host build's), every component
#         for linux/amd64 (the real node on this machine runs them) and the
#         session node's two (worker, supervisor) for linux/arm64;
#       release (`make images`) profile `image` (optimised), every
#         component for both platforms.
#   images.sh push REGISTRY [local|release]
#       each binary of the set packed from scratch into an OCI image by
#       crane (go-containerregistry, built by build-binaries.sh), an
#       image's platforms joined into one index, pushed to
#       REGISTRY/hangar/<image>; plain HTTP, so REGISTRY is a loopback one
#
# `push` prints "<image> <REGISTRY>/hangar/<image>@<index digest>" per image
# on stdout (what the chart's image.digests take); progress on stderr. The
# packing is reproducible (root-owned files, one fixed time, sorted, no
# creation time in the config), so a build's digests are the same wherever
# it is pushed.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
# shellcheck source=lib/timing.sh
source "$here/lib/timing.sh"
CACHE="${HANGAR_CACHE:-$HOME/.cache/hangar}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$CACHE/target}"
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
# Rust target -> its binutils' strip.
declare -A strippers=([x86_64-unknown-linux-musl]=strip [aarch64-unknown-linux-musl]=aarch64-linux-gnu-strip)

# set_components <set> <target>: the images a set builds for a target. The
# local set's arm64 is what a session node runs; the control plane's arm64
# binaries are the same code for another triple, built by `make images`.
set_components() {
  case "$1/$2" in
    local/aarch64-unknown-linux-musl) echo supervisor worker ;;
    local/* | release/*) printf '%s\n' "${!images[@]}" | sort | tr '\n' ' ' ;;
    *) log "unknown image set $1 (local or release)"; exit 2 ;;
  esac
}

# set_profile <set>: cargo's profile and the directory it builds into.
set_profile() {
  case "$1" in
    local) echo "dev debug" ;;
    release) echo "image image" ;;
    *) log "unknown image set $1 (local or release)"; exit 2 ;;
  esac
}

# staged <set> <target> <binary>: where a set's stripped binary is kept.
staged() {
  echo "$CACHE/images/$1/$2/$3"
}

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
  local set=${1:-local}
  for tool in musl-gcc aarch64-linux-gnu-gcc aarch64-linux-gnu-strip; do
    command -v "$tool" >/dev/null || { log "$tool is missing (e2e/scripts/system-packages.sh installs it)"; exit 1; }
  done
  [[ -f /usr/lib/aarch64-linux-musl/musl-gcc.specs ]] ||
    { log "musl-dev:arm64 is missing (e2e/scripts/system-packages.sh installs it)"; exit 1; }
  cross_compilers
  local installed target profile dir
  read -r profile dir < <(set_profile "$set")
  installed=$(rustup target list --installed)
  for target in "${!platforms[@]}"; do
    grep -qx "$target" <<<"$installed" || { log "rustup target add $target"; rustup target add "$target" >&2; }
  done
  for target in $(printf '%s\n' "${!platforms[@]}" | sort); do
    local bins=() components image
    components=$(set_components "$set" "$target")
    for image in $components; do bins+=(--bin "${images[$image]}"); done
    log "$set: cargo build --profile $profile --target $target (${components% })"
    local start=$SECONDS
    (cd "$root" && cargo build --profile "$profile" --target "$target" "${bins[@]}" >&2)
    timing_record "images-$set-${target%%-*}" "$((SECONDS - start))"
    log "built $target in $((SECONDS - start))s"
    # Stripped copies: what the images carry, and what the tests run.
    local out
    out=$(staged "$set" "$target" "")
    rm -rf "$out" && mkdir -p "$out"
    for image in $components; do
      "${strippers[$target]}" -o "$out/${images[$image]}" "$CARGO_TARGET_DIR/$target/$dir/${images[$image]}"
    done
  done
}

# Debian's ca-certificates bundle (system-packages.sh installs it).
CA_BUNDLE=/etc/ssl/certs/ca-certificates.crt

push() {
  local registry=$1 set=${2:-local}
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
      [[ " $(set_components "$set" "$target") " == *" $image "* ]] || continue
      local platform=${platforms[$target]}
      local built
      built=$(staged "$set" "$target" "$b")
      [[ -x "$built" ]] || { log "$built is missing: run images.sh build $set (make test builds the local set)"; exit 1; }
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

# An unknown set is refused here: the helpers above run in subshells,
# where their own refusal would not stop the script.
[[ "${1:-}" != build || "${2:-local}" =~ ^(local|release)$ ]] &&
  [[ "${1:-}" != push || "${3:-local}" =~ ^(local|release)$ ]] ||
  { log "unknown image set (local or release)"; exit 2; }
case "${1:-}" in
  build) build "${2:-local}" ;;
  push) push "${2:?usage: images.sh push REGISTRY [local|release]}" "${3:-local}" ;;
  *) echo "usage: images.sh build [local|release] | images.sh push REGISTRY [local|release]" >&2; exit 2 ;;
esac
