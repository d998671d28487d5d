# A local stand-in for the official rust:1-bookworm image (no image registry
# is reachable on the project's CI machines): the local Debian base plus
# Debian's Rust 1.96 (rustc-web/cargo-web, from bookworm-security; bookworm's
# own rustc is 1.63 and the locked dependencies need 1.88), clang and
# libclang-dev for the redis-module crate's bindgen. Built by
# `scripts/docker.sh builder` with --network host (apt, then cargo, reach
# their registries through the host). ca/ holds the host's own extra CA
# certificates (/usr/local/share/ca-certificates, e.g. a proxy's), so cargo
# in the image trusts what the host trusts.
ARG BASE=redis-lock-base:bookworm
FROM ${BASE}
COPY ca/ /usr/local/share/ca-certificates/
RUN echo 'deb http://deb.debian.org/debian-security bookworm-security main' \
        > /etc/apt/sources.list.d/security.list \
 && apt-get update -qq \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        rustc-web cargo-web clang libclang-dev libc6-dev ca-certificates >/dev/null \
 && rm -rf /var/lib/apt/lists/* \
 && update-ca-certificates >/dev/null \
 && rustc --version && cargo --version
