#!/usr/bin/env bash
# `make test`: every test, from nothing, in the least time two cores allow.
#
# The Go tools and the moto venv need no Rust, and cargo leaves a core idle
# at times (one large crate at a time, links), so they build in the
# background (at a lower priority: the cargo builds are the longer path)
# beside the cargo builds: the local image set (e2e/scripts/images.sh),
# the workspace's binaries and the test binaries. The tests start once the
# control plane's tools are built too; the real node's (kubelet,
# containerd, …) go on building beside the first tests, which leave most
# of the machine idle, and a real-node test that comes to one before it is
# built waits for it (build-binaries.sh's per-binary lock). Each phase's
# seconds go to $HANGAR_TIMINGS (.ci/run prints them on one line).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
# shellcheck source=lib/timing.sh
source "$here/lib/timing.sh"
# shellcheck source=lib/background.sh
source "$here/lib/background.sh"
CACHE="${HANGAR_CACHE:-$HOME/.cache/hangar}"
export HANGAR_CACHE="$CACHE"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$CACHE/target}"
CARGO="${CARGO:-cargo}"
log() { printf '[make test] %s\n' "$*" >&2; }
cd "$root"

mkdir -p "$CACHE/logs"
go_log="$CACHE/logs/test-go-tools.log" moto_log="$CACHE/logs/test-moto-venv.log"
log "building the Go tools and the moto venv in the background (logs: $go_log, $moto_log)"
# Each in a session of its own, so a failed run stops the builds under it.
background "$go_log" 10 bash "$here/build-binaries.sh" test
go_tools=$BACKGROUND_PID
background "$moto_log" 0 bash -c "source '$here/lib/timing.sh'; timed moto-venv bash '$here/moto-venv.sh'"
moto=$BACKGROUND_PID
trap 'kill -- -$go_tools -$moto 2>/dev/null || true' EXIT

timed system-packages bash "$here/system-packages.sh"
timed images bash "$here/images.sh" build local
log "cargo build --workspace --bins"
timed build "$CARGO" build --workspace --bins
log "cargo test --workspace --no-run"
timed test-build "$CARGO" test --workspace --no-run
log "waiting for the control plane's Go tools and the moto venv"
start=$SECONDS
# Returns once each is built (waiting on the background build's locks).
bash "$here/build-binaries.sh" control-plane >/dev/null 2>>"$go_log" ||
  { log "building the Go tools failed; the log's tail:"; tail -n 40 "$go_log" >&2; exit 1; }
wait "$moto" || { log "the moto venv failed; its log:"; tail -n 40 "$moto_log" >&2; exit 1; }
timing_record wait-tools "$((SECONDS - start))"
timed test-run "$CARGO" test --workspace --no-fail-fast
