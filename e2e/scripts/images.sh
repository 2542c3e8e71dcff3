#!/usr/bin/env bash
# hangar's images without a Docker engine. Each binary is built static
# (musl) for linux/amd64 and linux/arm64, packed from scratch into an OCI
# image by crane (go-containerregistry, built by build-binaries.sh), and
# the two images joined into one multi-platform index, pushed to REGISTRY.
# Usage: images.sh REGISTRY [TAG]   e.g. images.sh 127.0.0.1:5000
# Prints "<image> <REGISTRY>/hangar/<image>@<index digest>" per image on
# stdout (what the chart's values take); progress on stderr.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
registry=${1:?usage: images.sh REGISTRY [TAG]}
tag=${2:-$(cd "$root" && git describe --always --dirty 2>/dev/null || echo dev)}
CACHE="${HANGAR_CACHE:-$HOME/.cache/hangar}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$CACHE/target}"
log() { printf '[images] %s\n' "$*" >&2; }

bin=$("$here/build-binaries.sh" crane)
crane="$bin/crane-$(sed -n 's/^GGCR_VERSION=//p' "$root/e2e/versions.env")"

# image name -> binary
declare -A images=(
  [operator]=hangar-operator
  [webhook]=hangar-webhook
  [gateway]=hangar-gateway
  [worker]=hangar-worker
  [supervisor]=hangar-supervisor
)
# Rust target -> OCI platform, and the C compiler for the crates with C
# code (ring): Debian's musl-gcc, and its arm64 cross gcc (linking against
# the musl that ships with Rust's target).
declare -A platforms=([x86_64-unknown-linux-musl]=linux/amd64 [aarch64-unknown-linux-musl]=linux/arm64)
export CC_x86_64_unknown_linux_musl=musl-gcc
export CC_aarch64_unknown_linux_musl=aarch64-linux-gnu-gcc
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_MUSL_LINKER=aarch64-linux-gnu-gcc

installed=$(rustup target list --installed)
for target in "${!platforms[@]}"; do
  grep -qx "$target" <<<"$installed" || { log "rustup target add $target"; rustup target add "$target" >&2; }
done

packages=()
for b in "${images[@]}"; do packages+=(--bin "$b"); done
for target in "${!platforms[@]}"; do
  log "cargo build --profile image --target $target (${images[*]})"
  start=$SECONDS
  (cd "$root" && cargo build -q --profile image --target "$target" "${packages[@]}" >&2)
  log "built $target in $((SECONDS - start))s"
done

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for image in $(printf '%s\n' "${!images[@]}" | sort); do
  b=${images[$image]}
  refs=()
  for target in $(printf '%s\n' "${!platforms[@]}" | sort); do
    platform=${platforms[$target]}
    layer="$work/$image-${platform//\//-}.tar"
    mkdir -p "$work/$image-$target/usr/local/bin"
    cp "$CARGO_TARGET_DIR/$target/image/$b" "$work/$image-$target/usr/local/bin/$b"
    # Reproducible: root-owned, one fixed time, sorted.
    tar --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 \
      -C "$work/$image-$target" -cf "$layer" usr
    ref="$registry/hangar/$image:$tag-${platform//\//-}"
    "$crane" append --insecure --oci-empty-base --platform "$platform" -f "$layer" -t "$ref" >/dev/null
    # Non-root by default; the worker's DaemonSet asks for root itself.
    "$crane" mutate --insecure "$ref" --entrypoint "/usr/local/bin/$b" --user 65532:65532 \
      -t "$ref" >/dev/null
    refs+=(-m "$ref")
  done
  index="$registry/hangar/$image:$tag"
  "$crane" index append --insecure "${refs[@]}" -t "$index" >/dev/null
  digest=$("$crane" digest --insecure "$index")
  log "$image: $index@$digest"
  echo "$image $registry/hangar/$image@$digest"
done
