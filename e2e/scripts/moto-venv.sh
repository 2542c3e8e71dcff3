#!/usr/bin/env bash
# Creates the Python venv with moto's server (EC2 + S3 on loopback) in the
# cache, keyed by moto's version. Prints the venv path on stdout.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=../versions.env
source "$here/../versions.env"
CACHE="${HANGAR_CACHE:-$HOME/.cache/hangar}"
venv="$CACHE/venv/moto-$MOTO_VERSION"
# .complete is written last, so an interrupted install is redone, not trusted.
if [[ ! -f "$venv/.complete" ]]; then
  echo "[moto-venv] creating $venv (moto[server]==$MOTO_VERSION from PyPI)" >&2
  rm -rf "$venv"
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check "moto[server]==$MOTO_VERSION" >&2
  touch "$venv/.complete"
fi
echo "$venv"
