# redis-lock from Python with redis-py (pip install redis).
# Wait in the server's line with BLOCK, send the fencing token with every
# write to the resource, renew with EXTEND, release.
import os
import sqlite3
import tempfile
import threading
import uuid

import redis

r = redis.Redis.from_url(os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"))
KEY = "lock:invoice:42"


def acquire(token, ttl_ms, wait_ms):
    """The fencing token (an int), or None if the lock stayed taken for wait_ms.
    BLOCK waits in the server's FIFO line: no polling. redis-py's default
    socket_timeout is None; if you set one, make it longer than wait_ms."""
    return r.execute_command("LOCK.ACQUIRE", KEY, token, ttl_ms, "BLOCK", wait_ms)


def extend(token, ttl_ms):
    return r.execute_command("LOCK.EXTEND", KEY, token, ttl_ms) == 1


def release(token):
    return r.execute_command("LOCK.RELEASE", KEY, token) == 1


class Renewer(threading.Thread):
    """Extends the lock every ttl/3 until stopped; sets `lost` if refused."""

    def __init__(self, token, ttl_ms):
        super().__init__(daemon=True)
        self.token, self.ttl_ms = token, ttl_ms
        self.stopped, self.lost = threading.Event(), threading.Event()
        self.renewals = 0
        self.renewed = threading.Condition()

    def run(self):
        while not self.stopped.wait(self.ttl_ms / 3000):
            if not extend(self.token, self.ttl_ms):
                self.lost.set()
                return
            with self.renewed:
                self.renewals += 1
                self.renewed.notify_all()

    def stop(self):
        self.stopped.set()
        self.join()


# The protected resource: a row that remembers the highest fence that wrote it.
db = sqlite3.connect(os.path.join(tempfile.mkdtemp(), "app.db"), isolation_level=None)
db.execute("CREATE TABLE invoice (id INTEGER PRIMARY KEY, status TEXT, fence INTEGER NOT NULL)")
db.execute("INSERT INTO invoice VALUES (42, 'new', 0)")


def write(status, fence):
    """Applied only if no later holder has written (fence <= ours)."""
    cur = db.execute(
        "UPDATE invoice SET status = ?, fence = ? WHERE id = 42 AND fence <= ?",
        (status, fence, fence),
    )
    return cur.rowcount == 1


worker_a, worker_b = uuid.uuid4().hex, uuid.uuid4().hex

fence_a = acquire(worker_a, ttl_ms=500, wait_ms=5000)
print("A acquired: fence", fence_a)
print("A writes:", write("paid", fence_a))

# A stalls (a GC pause, a slow disk) past its 500 ms lease. B waits in line
# meanwhile and is handed the lock the moment A's lease ends.
fence_b = acquire(worker_b, ttl_ms=3000, wait_ms=5000)
print("B acquired: fence", fence_b)

renewer = Renewer(worker_b, ttl_ms=3000)
renewer.start()
with renewer.renewed:  # B works while its lease is renewed in the background
    renewer.renewed.wait_for(lambda: renewer.renewals >= 1 or renewer.lost.is_set())
print("B writes:", write("refunded", fence_b))
renewer.stop()
print("B renewed:", renewer.renewals >= 1, "lost:", renewer.lost.is_set())

# A wakes up and carries on with its old token: the database refuses it.
print("A writes:", write("paid twice", fence_a))
print("A extends:", extend(worker_a, 3000))
print("A releases:", release(worker_a))
print("B releases:", release(worker_b))
print("invoice 42:", db.execute("SELECT status, fence FROM invoice").fetchone())
