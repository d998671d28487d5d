"""pottery's Redlock (PyPI `pottery` over redis-py) driven for
client/examples/redlock_bench.rs. One argument, JSON:
  {"mode": "latency"|"contention"|"clockjump", "ports": [p1..p5], ...}
prints one JSON object on stdout. Run by the Rust bench with PYTHONPATH
pointing at the install under target/bench-peers/python.
"""

import json
import logging
import multiprocessing
import sys
import time

from pottery import Redlock
from redis import Redis

logging.disable(logging.CRITICAL)
args = json.loads(sys.argv[1])
# pottery retries after uniform(0, _RETRY_DELAY) s (a class attribute, 0.2
# by default): the same pause as the other clients in this run.
Redlock._RETRY_DELAY = args["retry_ms"] / 1000


def connect():
    return [Redis(host="127.0.0.1", port=p) for p in args["ports"]]


def make(masters, key):
    return Redlock(key=key, masters=masters, auto_release_time=args["ttl_ms"] / 1000)


def us(seconds):
    return int(round(seconds * 1e6))


def latency():
    masters = connect()
    for m in masters:
        m.ping()
    lock = make(masters, args["key"])
    acquire, release = [], []
    for i in range(args["warmup"] + args["iterations"]):
        t0 = time.perf_counter()
        if not lock.acquire(blocking=False):
            raise RuntimeError("uncontended acquire failed")
        t1 = time.perf_counter()
        lock.release()
        t2 = time.perf_counter()
        if i >= args["warmup"]:
            acquire.append(us(t1 - t0))
            release.append(us(t2 - t1))
    return {"acquire_us": acquire, "release_us": release}


def contention():
    """One process per client (threads would share the GIL, which is not
    how 16 clients of a lock run), started by fork."""
    n = args["clients"]
    ctx = multiprocessing.get_context("fork")
    holding = ctx.Value("i", 0)
    overlaps = ctx.Value("i", 0)
    errors = ctx.Value("i", 0)
    held_us = ctx.Value("q", 0)
    attempts = ctx.Value("q", 0)
    results = ctx.Queue()
    go = ctx.Event()

    def run(i):
        masters = connect()
        for m in masters:
            m.ping()
        lock = make(masters, args["key"])
        # Count attempts (rounds on all five nodes), granted or not; this
        # process has its own copy of the class.
        one_round = Redlock._Redlock__acquire_masters

        def counted(self, *a, **k):
            with attempts.get_lock():
                attempts.value += 1
            return one_round(self, *a, **k)

        Redlock._Redlock__acquire_masters = counted
        go.wait()
        end = time.monotonic() + args["seconds"]
        mine = 0
        while time.monotonic() < end:
            try:
                if not lock.acquire(blocking=True, timeout=2.0):
                    continue
            except Exception:
                with errors.get_lock():
                    errors.value += 1
                continue
            with holding.get_lock():
                if holding.value:
                    with overlaps.get_lock():
                        overlaps.value += 1
                holding.value = 1
            held = time.monotonic()
            time.sleep(args["hold_ms"] / 1000)
            with held_us.get_lock():
                held_us.value += int((time.monotonic() - held) * 1e6)
            with holding.get_lock():
                holding.value = 0
            mine += 1
            try:
                lock.release()
            except Exception:
                with errors.get_lock():
                    errors.value += 1
        results.put((i, mine))

    procs = [ctx.Process(target=run, args=(i,)) for i in range(n)]
    for p in procs:
        p.start()
    time.sleep(0.5)  # let every client connect
    start = time.monotonic()
    go.set()
    grants = [0] * n
    for _ in range(n):
        i, mine = results.get(timeout=args["seconds"] + 60)
        grants[i] = mine
    elapsed = time.monotonic() - start
    for p in procs:
        p.join()
    return {
        "grants": grants,
        "elapsed_s": elapsed,
        "hold_ms": held_us.value / 1000 / max(sum(grants), 1),
        "attempts": attempts.value,
        "overlaps": overlaps.value,
        "errors": errors.value,
    }


def clockjump():
    """Kleppmann's clock jump in its simplest faithful form (see the Rust
    side): D and E refuse client 1 (a placeholder holds them, standing for
    nodes client 1 could not reach), client 1 holds A, B, C; the placeholder
    goes, and the key on C is deleted as if C's clock had jumped past the
    lease; client 2 then takes C, D, E."""
    raw = connect()
    ttl_ms = args["ttl_ms"]
    lock1 = make(connect(), args["key"])
    lock2 = make(connect(), args["key"])
    key = lock1.key  # pottery prefixes the name
    for r in raw:
        r.delete(key)
    for r in raw[3:]:
        r.set(key, "placeholder", px=ttl_ms)
    start = time.monotonic()
    if not lock1.acquire(blocking=False):
        raise RuntimeError("client 1 did not get A, B, C")
    # pottery's own validity: the TTL less drift and the time acquiring took.
    valid_until = start + ttl_ms / 1000 * 0.99 - 0.002
    holders1 = [r.get(key) == lock1._uuid.encode() for r in raw]
    for r in raw[3:]:
        r.delete(key)
    raw[2].delete(key)  # C's clock jumps: its copy of the lease is gone
    got2 = lock2.acquire(blocking=False)
    client1_valid = time.monotonic() < valid_until
    for lock in (lock2, lock1):
        try:
            lock.release()
        except Exception:
            pass
    return {
        "client1_nodes": holders1,
        "client2_granted": bool(got2),
        "client1_still_valid": client1_valid,
        "overlap": bool(got2) and client1_valid,
        # pottery gives no fencing token: a store cannot order the writes.
        "stale_write_rejected": None,
    }


MODES = {"latency": latency, "contention": contention, "clockjump": clockjump}
print(json.dumps(MODES[args["mode"]]()))
