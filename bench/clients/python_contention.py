"""Contention on one key from Python, for section 10 of examples/bench
(examples/bench/clients.rs): N threads, each with its own redis-py client,
loop acquire (its wait measured from the call to the grant) -> hold ->
release, for S seconds. One argument, JSON:
  {"port": P, "lib": "this"|"redis-py"|"python-redis-lock"|"pottery",
   "clients": 16, "hold_ms": 2, "seconds": S}
prints one JSON object: grants, seconds, waits_us, per_client, errors.
Each library keeps its defaults for how it waits (redis-py's Lock sleeps
0.1 s between tries, python-redis-lock waits on a BLPOP signal, pottery
retries after a random pause; this client waits in the server's line)."""

import json
import sys
import threading
import time
import uuid

import redis

args = json.loads(sys.argv[1])
port, lib = args["port"], args["lib"]
clients, hold, seconds = args.get("clients", 16), args.get("hold_ms", 2) / 1000, args["seconds"]
key = "bench:contended"
TTL = 10


def lock_of(r):
    """acquire() -> handle or None, release(handle) for the library."""
    if lib == "this":
        from redis_lock_client import Locks

        locks = Locks(r, renew=False)
        return (lambda: locks.acquire(key, ttl=TTL, timeout=10)), (lambda lease: lease.release())
    if lib == "redis-py":
        def acquire():
            lock = r.lock(key, timeout=TTL, blocking_timeout=10)
            return lock if lock.acquire() else None
        return acquire, (lambda lock: lock.release())
    if lib == "python-redis-lock":
        import redis_lock

        def acquire():
            lock = redis_lock.Lock(r, key, expire=TTL)
            return lock if lock.acquire(timeout=10) else None
        return acquire, (lambda lock: lock.release())
    if lib == "pottery":
        from pottery import Redlock

        def acquire():
            lock = Redlock(key=key, masters={r}, auto_release_time=TTL)
            return lock if lock.acquire(timeout=10) else None
        return acquire, (lambda lock: lock.release())
    raise SystemExit(f"unknown lib {lib}")


waits, per_client, errors = [], [0] * clients, []
stop = threading.Event()
lock = threading.Lock()


def worker(i):
    r = redis.Redis(port=port)
    acquire, release = lock_of(r)
    while not stop.is_set():
        start = time.perf_counter()
        try:
            handle = acquire()
        except Exception as e:  # noqa: BLE001
            errors.append(repr(e))
            continue
        waited = time.perf_counter() - start
        if handle is None:
            continue
        time.sleep(hold)
        try:
            release(handle)
        except Exception as e:  # noqa: BLE001
            errors.append(repr(e))
        with lock:
            waits.append(int(waited * 1e6))
            per_client[i] += 1


threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(clients)]
started = time.perf_counter()
for t in threads:
    t.start()
time.sleep(seconds)
stop.set()
for t in threads:
    t.join(timeout=15)
elapsed = time.perf_counter() - started
print(json.dumps({"grants": sum(per_client), "seconds": elapsed, "waits_us": waits,
                  "per_client": per_client, "errors": len(errors),
                  "first_error": errors[0] if errors else None}))
