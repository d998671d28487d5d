#!/usr/bin/env bash
# Docker for `make docker-image`, `make docker-build` and `make docker-test`.
#   scripts/docker.sh daemon    docker.io installed (as root) and a daemon answering
#   scripts/docker.sh base      the base image: redis:7.4-bookworm if it can be
#                               pulled, else a local Debian base (see below);
#                               prints its name
#   scripts/docker.sh image     Dockerfile on that base, tagged $IMAGE
#   scripts/docker.sh build     Dockerfile.build (the module built in a Rust
#                               image), tagged $IMAGE-build, then checks the
#                               module loads in it
#   scripts/docker.sh cleanup   removes test containers a killed run left behind
#
# No image registry is reachable on the project's CI machines. Then the base
# is built here: debootstrap (Debian's default mirror) of bookworm with
# Debian's redis-server (7.0), imported as redis-lock-base:bookworm (about a
# minute, once: kept and reused; DOCKER_REBUILD_BASE=1 rebuilds it), and the
# Rust image is that base plus Debian's Rust (docker/rust-builder.Dockerfile).
set -euo pipefail
cd "$(dirname "$0")/.."

IMAGE=${IMAGE:-redis-lock:test}
OFFICIAL_BASE=${BASE:-redis:7.4-bookworm}
OFFICIAL_RUST=${RUST_IMAGE:-rust:1-bookworm}
LOCAL_BASE=redis-lock-base:bookworm
LOCAL_RUST=redis-lock-rust:bookworm
LOG_DIR=${DOCKER_LOG_DIR:-target/docker}
mkdir -p "$LOG_DIR"

have_image() { docker image inspect "$1" >/dev/null 2>&1; }

# An image, pulled if it is not here; false (quickly) when no registry answers.
pullable() {
  have_image "$1" && return 0
  timeout 60 docker pull -q "$1" >/dev/null 2>&1
}

daemon() {
  if ! command -v dockerd >/dev/null; then
    if [ "$(id -u)" != 0 ]; then
      echo "Docker is missing. Run: sudo apt-get install -y docker.io" >&2
      exit 1
    fi
    echo "Installing docker.io ..."
    DEBIAN_FRONTEND=noninteractive apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker.io >/dev/null
  fi
  if docker version >/dev/null 2>&1; then
    return
  fi
  if [ "$(id -u)" != 0 ]; then
    echo "No Docker daemon answers. Start one (sudo dockerd) or add yourself to the docker group." >&2
    exit 1
  fi
  # No bridge and no iptables rules: containers use the host's network
  # (--network host) and the tests bind 127.0.0.1 only.
  echo "Starting dockerd --bridge=none --iptables=false (log: $LOG_DIR/dockerd.log) ..."
  nohup dockerd --bridge=none --iptables=false >"$LOG_DIR/dockerd.log" 2>&1 &
  echo $! >"$LOG_DIR/dockerd.pid"
  for _ in $(seq 1 60); do
    docker version >/dev/null 2>&1 && return
    sleep 0.5
  done
  echo "dockerd did not answer within 30 s; see $LOG_DIR/dockerd.log" >&2
  exit 1
}

local_base() {
  if have_image "$LOCAL_BASE" && [ -z "${DOCKER_REBUILD_BASE:-}" ]; then
    return
  fi
  command -v debootstrap >/dev/null || {
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null
  }
  local rootfs
  rootfs=$(mktemp -d /tmp/redis-lock-rootfs.XXXXXX)
  echo "No registry: building $LOCAL_BASE (debootstrap bookworm with redis-server; about a minute) ..." >&2
  if ! debootstrap --variant=minbase --include=redis-server bookworm "$rootfs" \
      >"$LOG_DIR/debootstrap.log" 2>&1; then
    echo "debootstrap failed; see $LOG_DIR/debootstrap.log" >&2
    rm -rf "$rootfs"
    exit 1
  fi
  rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
  tar -C "$rootfs" -c . | docker import -c 'CMD ["redis-server"]' - "$LOCAL_BASE" >/dev/null
  rm -rf "$rootfs"
}

base() {
  if pullable "$OFFICIAL_BASE"; then
    echo "$OFFICIAL_BASE"
  else
    local_base
    echo "$LOCAL_BASE"
  fi
}

image() {
  local from
  from=$(base)
  [ -f target/release/libredis_lock.so ] || cargo build --release
  echo "Building $IMAGE (Dockerfile on $from) ..."
  docker build -q --force-rm --build-arg BASE="$from" -t "$IMAGE" . >/dev/null
}

build() {
  local from rust
  from=$(base)
  if pullable "$OFFICIAL_RUST"; then
    rust=$OFFICIAL_RUST
  else
    rust=$LOCAL_RUST
    if ! have_image "$LOCAL_RUST" || [ -n "${DOCKER_REBUILD_BASE:-}" ]; then
      echo "No registry: building $LOCAL_RUST (docker/rust-builder.Dockerfile) ..."
      # Its context: the Dockerfile and the host's extra CA certificates.
      local ctx=$LOG_DIR/rust-builder
      rm -rf "$ctx" && mkdir -p "$ctx/ca"
      cp docker/rust-builder.Dockerfile "$ctx/Dockerfile"
      cp /usr/local/share/ca-certificates/*.crt "$ctx/ca/" 2>/dev/null || true
      docker build --force-rm --network host --build-arg BASE="$LOCAL_BASE" -t "$LOCAL_RUST" \
        "$ctx" >"$LOG_DIR/rust-builder.log" 2>&1 || {
        tail -20 "$LOG_DIR/rust-builder.log" >&2
        exit 1
      }
    fi
  fi
  echo "Building $IMAGE-build (Dockerfile.build: $rust, then $from) ..."
  docker build --force-rm --network host --build-arg RUST_IMAGE="$rust" --build-arg BASE="$from" \
    -f Dockerfile.build -t "$IMAGE-build" . >"$LOG_DIR/docker-build.log" 2>&1 || {
    tail -30 "$LOG_DIR/docker-build.log" >&2
    exit 1
  }
  check "$IMAGE-build"
}

# Starts the image on a free loopback port and takes a lock on it.
check() {
  local name port reply
  name=redis-lock-check-$$
  port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
  docker run -d --name "$name" --network host "$1" --bind 127.0.0.1 --port "$port" >/dev/null
  for _ in $(seq 1 50); do
    reply=$(redis-cli -p "$port" LOCK.ACQUIRE check-key check-token 1000 2>/dev/null || true)
    case $reply in
      [0-9]*)
        echo "$1: the module loads, LOCK.ACQUIRE gave $reply"
        docker rm -f "$name" >/dev/null
        return ;;
    esac
    sleep 0.2
  done
  docker logs "$name" >&2 || true
  docker rm -f "$name" >/dev/null
  echo "$1: no lock granted" >&2
  exit 1
}

cleanup() {
  local left
  left=$(docker ps -aq --filter label=redis-lock-test)
  if [ -n "$left" ]; then
    echo "Removing $(echo "$left" | wc -l) test container(s) left behind ..."
    docker rm -f -v $left >/dev/null
  fi
}

case ${1:-} in
  daemon) daemon ;;
  base) daemon && base ;;
  image) daemon && image ;;
  build) daemon && build ;;
  check) check "${2:-$IMAGE}" ;;
  cleanup) cleanup ;;
  *) echo "usage: $0 daemon|base|image|build|check [IMAGE]|cleanup" >&2; exit 2 ;;
esac
