#!/bin/sh
# Entry point of the redis-lock images. Follows the official redis image:
# `docker run IMAGE` starts redis-server; `docker run IMAGE --opt value ...`
# or `docker run IMAGE /usr/local/etc/redis/redis.conf --opt value` passes
# the options (and the config file) to redis-server; any other command runs
# as given. redis-server gets `--loadmodule` of the module, after the config
# file if there is one, unless the arguments or that file already load it
# (then with their own module arguments).
set -e
module=/usr/local/lib/redis/modules/libredis_lock.so

# First argument an option or a .conf file: they are redis-server's.
if [ "${1#-}" != "$1" ] || [ "${1%.conf}" != "$1" ]; then
	set -- redis-server "$@"
fi

if [ "$1" = redis-server ]; then
	shift
	conf=
	if [ $# -gt 0 ] && [ "${1#-}" = "$1" ]; then
		conf=$1
		shift
	fi
	loaded=
	case " $* " in *libredis_lock.so*) loaded=yes ;; esac
	if [ -n "$conf" ] && grep -qs '^[[:space:]]*loadmodule[[:space:]].*libredis_lock\.so' "$conf"; then
		loaded=yes
	fi
	if [ -z "$loaded" ]; then
		set -- --loadmodule "$module" "$@"
	fi
	if [ -n "$conf" ]; then
		set -- "$conf" "$@"
	fi
	set -- redis-server "$@"
fi

# The official image's own entry point: chown of /data, gosu redis, umask.
if command -v docker-entrypoint.sh >/dev/null 2>&1; then
	exec docker-entrypoint.sh "$@"
fi

# A local Debian base (no docker-entrypoint.sh): the same steps, setpriv for gosu.
if [ "$1" = redis-server ] && [ "$(id -u)" = 0 ]; then
	find . \! -user redis -exec chown redis '{}' +
	exec setpriv --reuid=redis --regid=redis --init-groups "$0" "$@"
fi
um="$(umask)"
if [ "$um" = 0022 ]; then
	umask 0077
fi
exec "$@"
