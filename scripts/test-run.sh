#!/usr/bin/env bash
# Runs a test command (make's test steps) and then judges the run as a whole:
#   scripts/test-run.sh NAME [--no-skips-in-ci] -- COMMAND...
# * Every process the run starts inherits REDIS_LOCK_TEST_RUN (a marker
#   unique to this run); when COMMAND ends, any process still carrying it
#   (a test server, a redis-lock, a job's child), and any container labelled
#   redis-lock-test, is a leftover: listed, stopped, and the run fails.
# * Every test that skips itself records why in REDIS_LOCK_SKIP_LOG
#   (testkit::skip); the summary counts and lists them, and takes them out
#   of the passes libtest reports (a skipped test returns, so libtest says
#   "ok"). With --no-skips-in-ci, a run under CI=true fails on any skip
#   except one the test mode or the server binary imposes.
# The last line is "NAME: P passed, F failed, S skipped".
set -uo pipefail
name=$1
shift
strict=0
if [ "${1:-}" = --no-skips-in-ci ]; then
  strict=1
  shift
fi
[ "${1:-}" = -- ] && shift

top=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$top/target/test-runs"
marker="run-$$-$(date +%s%N)"
export REDIS_LOCK_TEST_RUN=$marker
export REDIS_LOCK_SKIP_LOG="$top/target/test-runs/$marker.skips"
output="$top/target/test-runs/$marker.out"
: >"$REDIS_LOCK_SKIP_LOG"

# Into a file, shown as it grows: a leftover that kept the command's
# output open cannot hold this script up (a pipe to tee would wait for it).
# Made first, so `tail` never starts before the command has opened it (it
# then gave up: "no files remaining", and the run went unshown).
: >"$output"
"$@" >>"$output" 2>&1 &
command_pid=$!
tail -n +1 --pid="$command_pid" -f "$output"
wait "$command_pid"
status=$?

# ---- leftovers: processes that carry the marker, other than this script
# and its ancestors (make, a shell, CI).
ancestors=" "
pid=$$
while [ -n "$pid" ] && [ "$pid" -gt 1 ]; do
  ancestors+="$pid "
  pid=$(awk '{print $4}' "/proc/$pid/stat" 2>/dev/null)
done
leftovers() {
  for environ in /proc/[0-9]*/environ; do
    p=${environ#/proc/}
    p=${p%/environ}
    case "$ancestors" in *" $p "*) continue ;; esac
    [ "$p" = "$BASHPID" ] && continue
    if tr '\0' '\n' 2>/dev/null <"$environ" | grep -qx "REDIS_LOCK_TEST_RUN=$marker"; then
      state=$(awk '{print $3}' "/proc/$p/stat" 2>/dev/null)
      # A zombie is already dead: its parent (gone with the run, or about to
      # reap it) holds nothing.
      [ "$state" = Z ] && continue
      echo "$p"
    fi
  done
}
# Give processes the run just signalled a moment to go.
left=""
for _ in 1 2 3 4 5 6 7 8 9 10; do
  left=$(leftovers)
  [ -z "$left" ] && break
  sleep 0.5
done
containers=""
if command -v docker >/dev/null 2>&1 && docker info >/dev/null 2>&1; then
  containers=$(docker ps -q --filter label=redis-lock-test 2>/dev/null)
fi
leftover_failure=0
if [ -n "$left" ] || [ -n "$containers" ]; then
  leftover_failure=1
  echo
  echo "$name: processes the tests started are still running after them (stopped now):"
  for p in $left; do
    echo "  pid $p: $(tr '\0' ' ' 2>/dev/null <"/proc/$p/cmdline")"
  done
  for c in $containers; do
    echo "  container $c: $(docker inspect -f '{{.Name}} {{.Args}}' "$c" 2>/dev/null)"
  done
  for p in $left; do kill -9 "$p" 2>/dev/null; done
  for c in $containers; do docker rm -f -v "$c" >/dev/null 2>&1; done
fi

# ---- the count: libtest's result lines, less the tests that skipped.
read -r passed failed ignored < <(
  grep -aE '^test result: ' "$output" | awk '
    { for (i = 1; i <= NF; i++) {
        if ($(i+1) ~ /^passed/) p += $i
        if ($(i+1) ~ /^failed/) f += $i
        if ($(i+1) ~ /^ignored/) g += $i } }
    END { print p+0, f+0, g+0 }'
)
skipped=$(grep -c . "$REDIS_LOCK_SKIP_LOG" || true)
passed=$((passed - skipped))
echo
if [ "$skipped" -gt 0 ]; then
  echo "$name: $skipped test(s) skipped, by server binary and reason:"
  awk -F'\t' '{ printf "  [%s] %s %s::%s: %s\n", $1, $2, $3, $4, $5 }' "$REDIS_LOCK_SKIP_LOG" | sort
fi
[ "$ignored" -gt 0 ] && echo "$name: $ignored test(s) marked #[ignore] (run by make stress) not run"
skip_failure=0
if [ "$strict" = 1 ] && [ "${CI:-}" = true ]; then
  must_run=$(awk -F'\t' '$1 == "missing"' "$REDIS_LOCK_SKIP_LOG" | wc -l)
  if [ "$must_run" -gt 0 ]; then
    skip_failure=1
    echo "$name: $must_run test(s) skipped for want of something .ci/run installs: CI fails"
  fi
fi
echo "$name: $passed passed, $failed failed, $skipped skipped"
if [ "$status" -ne 0 ]; then
  exit "$status"
fi
if [ "$leftover_failure" = 1 ] || [ "$skip_failure" = 1 ]; then
  exit 1
fi
exit 0
