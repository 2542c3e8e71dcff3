# Phase timings for `.ci/run` and `make test`, sourced by the e2e scripts.
# Each finished step appends "name seconds" to $HANGAR_TIMINGS when it is
# set (.ci/run sets it, then prints the file as one line at its end), so a
# note can quote where a cold run spent its time.

# timing_record <name> <seconds>
timing_record() {
  [[ -n "${HANGAR_TIMINGS:-}" ]] || return 0
  printf '%s %s\n' "$1" "$2" >>"$HANGAR_TIMINGS"
}

# timed <name> <command...>: runs the command, records its wall seconds
# (also when it fails, so a red run still says where time went).
timed() {
  local name=$1 start=$SECONDS rc=0
  shift
  "$@" || rc=$?
  timing_record "$name" "$((SECONDS - start))"
  return "$rc"
}

# timing_summary <file>: the recorded phases as one line, "name=Ns ...".
timing_summary() {
  [[ -s "$1" ]] || return 0
  awk '{printf "%s%s=%ss", (NR > 1 ? " " : ""), $1, $2} END {print ""}' "$1"
}
