#!/usr/bin/env bash
# The Debian packages the node side needs, installed when missing:
# cryptsetup (the workspace's LUKS2 volume), e2fsprogs (its filesystem),
# util-linux (losetup, blkid: the simulator's loop devices) and openssl
# (the simulator's instance metadata signs identity documents with it, as
# an implementation independent of the verifier under test); for hangar's
# own images (e2e/scripts/images.sh): musl-tools and the arm64 cross gcc
# with musl's arm64 headers and libc (static binaries for both platforms),
# qemu-user-static, which runs the arm64 binaries in the tests, and
# ca-certificates (the CA store the images carry); for
# the real node (e2e/src/real_node.rs): runc (containerd's runtime; it
# needs cgo, so it is not built here), iproute2 (the node's bridge) and
# busybox-static (a shell in the tenant image its sessions run).
set -euo pipefail
log() { echo "[system-packages] $*" >&2; }
missing=()
need() { command -v "$1" >/dev/null 2>&1 || missing+=("$2"); }
need cryptsetup cryptsetup-bin
need mkfs.ext4 e2fsprogs
need losetup util-linux
need blkid util-linux
need openssl openssl
need musl-gcc musl-tools
need aarch64-linux-gnu-gcc gcc-aarch64-linux-gnu
need qemu-aarch64-static qemu-user-static
[[ -x /usr/sbin/runc ]] || missing+=(runc)
need ip iproute2
# A static shell for the real node's tenant image (e2e/src/registry.rs).
dpkg -s busybox-static >/dev/null 2>&1 || missing+=(busybox-static)
# The CA store hangar's images carry (e2e/scripts/images.sh).
[[ -s /etc/ssl/certs/ca-certificates.crt ]] || missing+=(ca-certificates)
# musl's arm64 headers and libc come from the arm64 architecture of Debian.
arm64_musl=false
[[ -f /usr/lib/aarch64-linux-musl/musl-gcc.specs ]] || { arm64_musl=true; missing+=(musl-dev:arm64); }
[[ ${#missing[@]} -eq 0 ]] && { log "all present"; exit 0; }
if [[ $(id -u) -ne 0 ]] || ! command -v apt-get >/dev/null; then
  log "missing ${missing[*]} and cannot install them (needs root and apt-get); the tests that use them say so and skip"
  exit 0
fi
log "installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
if $arm64_musl && ! dpkg --print-foreign-architectures | grep -qx arm64; then
  dpkg --add-architecture arm64
  apt-get update >&2
fi
apt-get install -y --no-install-recommends "${missing[@]}" >&2 ||
  { apt-get update >&2 && apt-get install -y --no-install-recommends "${missing[@]}" >&2; }
