#!/usr/bin/env bash
# The Debian packages the node side needs, installed when missing:
# cryptsetup (the workspace's LUKS2 volume), e2fsprogs (its filesystem),
# util-linux (losetup, blkid: the simulator's loop devices) and openssl
# (the simulator's instance metadata signs identity documents with it, as
# an implementation independent of the verifier under test).
set -euo pipefail
log() { echo "[system-packages] $*" >&2; }
missing=()
need() { command -v "$1" >/dev/null 2>&1 || missing+=("$2"); }
need cryptsetup cryptsetup-bin
need mkfs.ext4 e2fsprogs
need losetup util-linux
need blkid util-linux
need openssl openssl
[[ ${#missing[@]} -eq 0 ]] && { log "all present"; exit 0; }
if [[ $(id -u) -ne 0 ]] || ! command -v apt-get >/dev/null; then
  log "missing ${missing[*]} and cannot install them (needs root and apt-get); the tests that use them say so and skip"
  exit 0
fi
log "installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get install -y --no-install-recommends "${missing[@]}" >&2 ||
  { apt-get update >&2 && apt-get install -y --no-install-recommends "${missing[@]}" >&2; }
