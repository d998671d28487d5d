# Replacing redis-py's Lock with redis-lock, and switching services over
# one at a time: old Lock and new FencedLock on the same key exclude each other.
import os
import threading
import time
import uuid

import redis

r = redis.Redis.from_url(os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"))


class FencedLock:
    """The shape of redis-py's Lock, plus a fencing token (`fence`)."""

    def __init__(self, r, key, ttl_ms=30000, wait_ms=5000):
        self.r, self.key, self.ttl_ms, self.wait_ms = r, key, ttl_ms, wait_ms
        self.token, self.fence = uuid.uuid4().hex, None

    def acquire(self):
        deadline = time.monotonic() + self.wait_ms / 1000
        while True:
            left_ms = max(0, int((deadline - time.monotonic()) * 1000))
            try:
                self.fence = self.r.execute_command(
                    "LOCK.ACQUIRE", self.key, self.token, self.ttl_ms, "BLOCK", left_ms
                )
                return self.fence is not None
            except redis.ResponseError as e:
                # Only while old clients remain: one of them holds the key
                # (a string). Taken: pause and try again.
                if not str(e).startswith("WRONGTYPE") or left_ms == 0:
                    raise
                time.sleep(0.05)

    def extend(self):
        return self.r.execute_command("LOCK.EXTEND", self.key, self.token, self.ttl_ms) == 1

    def release(self):
        return self.r.execute_command("LOCK.RELEASE", self.key, self.token) == 1


# An old service holds the lock with redis-py's Lock (SET NX PX) and lets
# go of it in 0.3 s; meanwhile a new one asks for it with FencedLock.
old = r.lock("invoice:42", timeout=30, thread_local=False)
print("old Lock acquires:", old.acquire(blocking=False))
threading.Timer(0.3, old.release).start()
new = FencedLock(r, "invoice:42", ttl_ms=30000, wait_ms=5000)
print("new FencedLock acquires:", new.acquire(), "fence", new.fence)

# While the new service holds it, the old Lock cannot take it.
print("old Lock acquires:", r.lock("invoice:42", timeout=30).acquire(blocking=False))
print("new extends:", new.extend())
print("new releases:", new.release())
print("new releases again:", new.release())
