#!/usr/bin/env bash
# Redis's own test suite with the module loaded: runs the Tcl suite of
# Debian's redis source (the same version as the installed redis-server)
# twice, once with `loadmodule libredis_lock.so` in the config of every
# server it starts and once without, and reports the tests that fail only
# with the module. Each such test is run once more with the module, alone: a
# test that passes then is reported as flaky. Exits non-zero if a test fails
# only with the module on both tries (or the module run hit an exception).
#
#   scripts/redis-suite.sh [extra runtest arguments]
#
# Environment:
#   UNITS      units to run, e.g. "integration/replication unit/other"
#              (default: every unit of the suite; both runs of all 84
#              units took 29 minutes on 2 busy cores with CLIENTS=2)
#   CLIENTS    parallel test clients (default 2)
#   REDIS_SRC  cache of the source and the runs (default target/redis-src)
#   MODULE     the module (default target/release/libredis_lock.so)
#
# Needs: redis-server and redis-tools (the binaries under test), tcl, dpkg-dev
# and a deb-src entry for Debian's archive (installed or added when run as
# root; otherwise the exact commands are printed).
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cache=$(realpath -m "${REDIS_SRC:-$root/target/redis-src}")
module=$(realpath -m "${MODULE:-$root/target/release/libredis_lock.so}")
clients=${CLIENTS:-2}
units=${UNITS:-}

# --- prerequisites ----------------------------------------------------------
missing=()
command -v redis-server >/dev/null || missing+=(redis-server)
command -v redis-cli >/dev/null || missing+=(redis-tools)
command -v tclsh8.6 >/dev/null || command -v tclsh8.5 >/dev/null || missing+=(tcl)
command -v dpkg-source >/dev/null || missing+=(dpkg-dev)
has_deb_src() {
  grep -Eqs '^(deb-src|Types:.*deb-src)' /etc/apt/sources.list /etc/apt/sources.list.d/*.list \
    /etc/apt/sources.list.d/*.sources
}
if [ ${#missing[@]} -gt 0 ] || ! has_deb_src; then
  if [ "$(id -u)" != 0 ]; then
    echo "Missing: ${missing[*]:-}$(has_deb_src || echo ' a deb-src entry')" >&2
    echo "Run as root, or:" >&2
    has_deb_src || echo "  sed 's/^Types: deb\$/Types: deb-src/' /etc/apt/sources.list.d/debian.sources | sudo tee /etc/apt/sources.list.d/debian-src.sources" >&2
    echo "  sudo apt-get update && sudo apt-get install -y ${missing[*]:-}" >&2
    exit 1
  fi
  if ! has_deb_src; then
    [ -f /etc/apt/sources.list.d/debian.sources ] || {
      echo "no /etc/apt/sources.list.d/debian.sources to copy a deb-src entry from" >&2
      exit 1
    }
    echo "Adding deb-src entries (/etc/apt/sources.list.d/debian-src.sources) ..."
    sed 's/^Types: deb$/Types: deb-src/' /etc/apt/sources.list.d/debian.sources \
      >/etc/apt/sources.list.d/debian-src.sources
  fi
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  [ ${#missing[@]} -eq 0 ] || apt-get install -y -qq "${missing[@]}" >/dev/null
fi

if [ ! -f "$module" ]; then
  (cd "$root" && cargo build --release)
fi

# --- the source, once per version --------------------------------------------
version=$(dpkg-query -W -f='${source:Version}' redis-server)
upstream=${version#*:}
upstream=${upstream%%-*}
pristine=$cache/${version//:/_}/redis-$upstream
if [ ! -x "$pristine/runtest" ]; then
  mkdir -p "$(dirname "$pristine")"
  (
    cd "$(dirname "$pristine")"
    rm -rf "redis-$upstream"
    # The installed version's source; if the archive has moved on, the current one.
    apt-get source --download-only -qq "redis=$version" 2>/dev/null ||
      apt-get source --download-only -qq redis
    dpkg-source -x --no-check ./redis_*.dsc "redis-$upstream" >/dev/null
  )
fi
# The C test modules some units load (unit/moduleapi/*), built once.
if [ ! -f "$pristine/tests/modules/datatype.so" ]; then
  echo "Building the suite's test modules (tests/modules) ..."
  make -C "$pristine/tests/modules" -j2 >"$cache/modules-build.log" 2>&1 || {
    echo "could not build Redis's test modules; see $cache/modules-build.log" >&2
    exit 1
  }
fi
echo "Redis test suite of redis $version (source in $pristine)"
echo "against $(redis-server --version)"

# --- one run -----------------------------------------------------------------
# run NAME [runtest arguments]: a fresh copy of the tree, the binaries under
# test linked in, the module loaded or not; the output goes to NAME.log.
run() {
  local name=$1
  shift
  local dir=$cache/run-$name
  rm -rf "$dir"
  cp -a "$pristine" "$dir"
  for bin in redis-server redis-cli redis-benchmark redis-check-aof redis-check-rdb; do
    ln -sf "$(command -v $bin)" "$dir/src/$bin"
  done
  if [[ $name == module* ]]; then
    for conf in default.conf minimal.conf; do
      printf '\nloadmodule %s\n' "$module" >>"$dir/tests/assets/$conf"
    done
  fi
  (
    cd "$dir"
    ./runtest --clients "$clients" --durable --dump-logs "$@" 2>&1 |
      sed -u 's/\x1b\[[0-9;]*m//g' | tee "$cache/$name.log" |
      grep --line-buffered -E '^\[[0-9]+/[0-9]+ |\[(err|exception|timeout)\]' || true
  )
}

# The failures of a run, one per line: "[err]: name in tests/unit/x.tcl".
failures() {
  { grep -E '^\[(err|exception|timeout)\]: ' "$cache/$1.log" || true; } |
    sed -E 's/ \([0-9]+ ms\)$//' | sort -u
}

unit_args=()
for u in $units; do unit_args+=(--single "$u"); done

started=$(date +%s)
echo "== with the module ($module)"
run module "${unit_args[@]}" "$@"
echo "== without the module"
run plain "${unit_args[@]}" "$@"

failures module >"$cache/module.failures"
failures plain >"$cache/plain.failures"
comm -23 "$cache/module.failures" "$cache/plain.failures" >"$cache/module-only.failures"

# Each test that failed only with the module, once more with it, alone.
confirmed=()
flaky=()
while IFS= read -r line; do
  if [[ $line =~ ^\[err\]:\ (.*)\ in\ tests/(.*)\.tcl$ ]]; then
    test_name=${BASH_REMATCH[1]}
    unit=${BASH_REMATCH[2]}
    run module-retry --single "$unit" --only "$test_name" >/dev/null
    if failures module-retry | grep -qF "$line"; then
      confirmed+=("$line")
    elif grep -qF "[ok]: $test_name" "$cache/module-retry.log"; then
      flaky+=("$line")
    else
      confirmed+=("$line (and not run again: --only found nothing)")
    fi
  else
    confirmed+=("$line")
  fi
done <"$cache/module-only.failures"

count() { grep -c "$1" "$cache/$2.log" || true; }

# Every unit must have run to its end in both runs: runtest prints
# "[i/n done]: unit (t seconds)" for each, and an exception ends the run.
incomplete=()
for name in module plain; do
  log=$cache/$name.log
  total=$({ grep -oE '^\[[0-9]+/[0-9]+ done\]' "$log" || true; } | head -1 |
    sed -E 's/^\[[0-9]+\/([0-9]+) done\]$/\1/')
  finished=$(grep -cE '^\[[0-9]+/[0-9]+ done\]' "$log" || true)
  if [ -z "$total" ] || [ "$finished" != "$total" ]; then
    incomplete+=("$name run: ${finished:-0} of ${total:-?} units finished")
  fi
  if grep -qE '^\[exception\]' "$log"; then
    incomplete+=("$name run: $(grep -m1 -E '^\[exception\]' "$log")")
  fi
  for u in $units; do
    grep -qE "^\[[0-9]+/[0-9]+ done\]: $u \(" "$log" || incomplete+=("$name run: $u did not finish")
  done
done

# Tests that passed without the module but neither passed nor failed with
# it did not run with it: that must have a reason, listed here.
KNOWN_NOT_RUN_WITH_MODULE=()
oks() { { grep -E '^\[ok\]: ' "$cache/$1.log" || true; } | sed -E 's/ \([0-9]+ ms\)$//' | sort -u; }
oks module >"$cache/module.oks"
oks plain >"$cache/plain.oks"
not_run=()
while IFS= read -r line; do
  test_name=${line#\[ok\]: }
  grep -qF "$test_name" "$cache/module.failures" && continue
  known=no
  for k in "${KNOWN_NOT_RUN_WITH_MODULE[@]}"; do [ "$k" = "$test_name" ] && known=yes; done
  [ $known = yes ] || not_run+=("$test_name")
done < <(comm -13 "$cache/module.oks" "$cache/plain.oks")
echo
echo "Units: ${units:-all}; ${clients} clients; $(($(date +%s) - started)) s in all."
echo "With the module:    $(count '\[ok\]' module) passed, $(wc -l <"$cache/module.failures") failed"
echo "Without the module: $(count '\[ok\]' plain) passed, $(wc -l <"$cache/plain.failures") failed"
if [ -s "$cache/plain.failures" ]; then
  echo "Failing without the module too (not the module's doing):"
  sed 's/^/  /' "$cache/plain.failures"
fi
if [ ${#flaky[@]} -gt 0 ]; then
  echo "Failed only with the module, but passed when run again (flaky):"
  printf '  %s\n' "${flaky[@]}"
fi
status=0
if [ ${#incomplete[@]} -gt 0 ]; then
  echo "NOT EVERY UNIT RAN TO ITS END (the counts above say nothing about the rest):"
  printf '  %s\n' "${incomplete[@]}"
  status=1
fi
if [ ${#not_run[@]} -gt 0 ]; then
  echo "PASSED WITHOUT THE MODULE BUT DID NOT RUN WITH IT:"
  printf '  %s\n' "${not_run[@]}"
  status=1
fi
if [ ${#confirmed[@]} -gt 0 ]; then
  echo "FAILED ONLY WITH THE MODULE:"
  printf '  %s\n' "${confirmed[@]}"
  status=1
fi
if [ $status != 0 ]; then
  echo "Logs: $cache/module.log, $cache/plain.log (server logs are dumped after each failure)"
  exit 1
fi
echo "No test fails only with the module."
