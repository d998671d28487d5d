# The official redis image with the redis-lock module, built on this machine
# first (`cargo build --release`). `make docker-image` builds it, on a local
# Debian base when the official image cannot be pulled (see README, Docker):
#
#   cargo build --release
#   docker build -t redis-lock .
#   docker run --rm -p 127.0.0.1:6379:6379 redis-lock
#   docker run --rm --network host redis-lock --bind 127.0.0.1 --port 7000 \
#       --appendonly yes --lock.restart-delay-ms 30000
#
# For an image that builds the module itself, see Dockerfile.build.
ARG BASE=redis:7.4-bookworm
FROM ${BASE}

# The official image's layout: modules here, data in /data (a volume, the
# working directory), a config file at /usr/local/etc/redis/redis.conf when
# you mount one, redis-server (as the redis user) as the default command.
RUN mkdir -p /usr/local/lib/redis/modules /usr/local/etc/redis /data \
 && chown redis:redis /data
COPY target/release/libredis_lock.so /usr/local/lib/redis/modules/libredis_lock.so
COPY docker/redis-lock-entrypoint.sh /usr/local/bin/redis-lock-entrypoint.sh

VOLUME /data
WORKDIR /data
EXPOSE 6379
ENTRYPOINT ["redis-lock-entrypoint.sh"]
CMD ["redis-server"]
