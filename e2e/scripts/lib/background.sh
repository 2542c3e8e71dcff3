# Background builds for `.ci/run` and `make test`, sourced by them.

# background <log> <nice> <command...>: starts the command in a session of
# its own (so the whole tree can be stopped with `kill -- -$pid`) at the
# given niceness; sets BACKGROUND_PID. A new session is a new scheduler
# autogroup where the kernel has them (Debian's does): niceness only ranks
# tasks inside a group, and groups share the CPU equally, so the group's
# own niceness is set too (from inside it), or a "nice" build would still
# take half of the machine from the cargo builds in the foreground.
background() {
  local log=$1 niceness=$2
  shift 2
  # shellcheck disable=SC2016
  setsid bash -c '
    n=$1; shift
    [[ ! -w /proc/self/autogroup ]] || echo "$n" >/proc/self/autogroup 2>/dev/null || true
    exec nice -n "$n" "$@"
  ' background "$niceness" "$@" >/dev/null 2>"$log" &
  BACKGROUND_PID=$!
}
