"""The asyncio client against a real server with the module. Each test
runs its own event loop (``asyncio.run``): no plugin needed."""

from __future__ import annotations

import asyncio
import os
import random
import time

import pytest
import redis
import redis.asyncio as aredis

from redis_lock_client.asyncio import (LockLost, Locks, ModuleMissing, NotAcquired, NotHeld,
                                       StaleFence)


def holder_of(r: redis.Redis, key: str):
    info = r.execute_command("LOCK.INFO", key)
    if info is None:
        return None
    fields = info if isinstance(info, dict) else dict(zip(info[0::2], info[1::2]))
    return fields[b"token"].decode(), fields[b"fence"]


def run(coro, limit: float = 60):
    """Runs ``coro`` in a fresh loop; past ``limit`` seconds every task's
    stack is printed and the test fails (instead of hanging)."""

    async def bounded():
        task = asyncio.ensure_future(coro)
        done, _ = await asyncio.wait({task}, timeout=limit)
        if not done:
            for t in asyncio.all_tasks():
                t.print_stack()
            task.cancel()
            raise AssertionError(f"the test's coroutine did not end within {limit} s")
        return task.result()

    return asyncio.run(bounded())


def test_acquire_wait_hand_off_and_release(server):
    sync = server.client()

    async def main():
        r = aredis.Redis(port=server.port)
        locks = Locks(r)
        first = await locks.acquire("job", ttl=30)
        assert first is not None and first.fence > 10**15
        assert await locks.acquire("job", ttl=30) is None
        waiter = asyncio.create_task(locks.acquire("job", ttl=30, timeout=10))
        while server.info("waiters") != 1:
            await asyncio.sleep(0.01)
        released = time.monotonic()
        assert await first.release() is True
        lease = await waiter
        assert lease.fence > first.fence
        assert time.monotonic() - released < 1.0, "handed over at once"
        assert holder_of(sync, "job") == (lease.token, lease.fence)
        await lease.release()
        await locks.aclose()
        await r.aclose()

    run(main())
    assert server.info("handoffs") == 1


def test_async_with_renews_releases_and_reports_a_lost_lock(server):
    sync = server.client()

    async def main():
        r = aredis.Redis(port=server.port)
        locks = Locks(r)
        async with locks.lock("k", ttl=0.3) as lease:
            await asyncio.sleep(1.0)
            assert lease.is_valid() and not lease.lost.is_set()
            assert holder_of(sync, "k") == (lease.token, lease.fence)
            with pytest.raises(NotAcquired):
                async with locks.lock("k", ttl=30, timeout=0.1):
                    pass
        assert holder_of(sync, "k") is None
        no_renew = Locks(r, renew=False)
        with pytest.raises(LockLost):
            async with no_renew.lock("short", ttl=0.3) as lease:
                await asyncio.wait_for(lease.lost.wait(), 2)
        await locks.aclose()
        await r.aclose()

    run(main())
    assert server.info("extends") >= 2


def test_exec_fenced_lock_all_shared_and_synchronized(server):
    sync = server.client()

    async def main():
        r = aredis.Redis(port=server.port)
        locks = Locks(r, renew=False)
        old = await locks.acquire("doc", ttl=0.2)
        assert await old.exec("SET", "doc:body", "v1") == b"OK"
        assert await old.fenced("doc:gate", "SET", "doc:copy", "v1") == b"OK"
        await asyncio.sleep(0.35)
        with pytest.raises(NotHeld):
            await old.exec("SET", "doc:body", "stale")
        new = await locks.acquire("doc", ttl=30)
        await new.fenced("doc:gate", "SET", "doc:copy", "v2")
        with pytest.raises(StaleFence) as e:
            await old.fenced("doc:gate", "SET", "doc:copy", "stale")
        assert (e.value.fence, e.value.mark) == (old.fence, new.fence)
        await new.release()
        async with locks.lock_all(["{o}a", "{o}b"], ttl=30) as both:
            assert holder_of(sync, "{o}a") == holder_of(sync, "{o}b") == (both.token, both.fence)
        r1 = await locks.acquire("report", ttl=30, shared=True)
        r2 = await locks.acquire("report", ttl=30, shared=True)
        assert r1 and r2 and await locks.acquire("report", ttl=30) is None
        permits = [await locks.acquire("sem", ttl=30, limit=2) for _ in range(3)]
        assert permits[0] and permits[1] and permits[2] is None
        for lease in (r1, r2, permits[0], permits[1]):
            await lease.release()
        seen = []

        @locks.synchronized("sync:k", ttl=30)
        async def work(x):
            seen.append(holder_of(sync, "sync:k") is not None)
            return x + 1

        assert await work(41) == 42 and seen == [True]
        with pytest.raises(TypeError):
            locks.synchronized("k")(lambda: None)
        await locks.aclose()
        await r.aclose()

    run(main())
    assert sync.get("doc:body") == b"v1" and sync.get("doc:copy") == b"v2"


def test_a_server_without_the_module_says_how_to_load_it(plain_server):
    async def main():
        r = aredis.Redis(port=plain_server.port)
        with pytest.raises(ModuleMissing) as e:
            await Locks(r).acquire("k", ttl=30)
        assert "--loadmodule" in str(e.value)
        await r.aclose()

    run(main())


def test_a_cancelled_wait_leaves_no_lock_and_no_place_in_line(server):
    """A waiting task cancelled at random moments while the holder
    releases at random moments: never a lock left, never a waiter."""
    sync = server.client()
    rng = random.Random(os.environ.get("PY_SEED", str(time.time_ns())))

    async def main():
        r = aredis.Redis(port=server.port)
        locks = Locks(r)
        granted = cancelled = 0
        for round_ in range(40):
            key = f"cancel:{round_}"
            holder = await locks.acquire(key, ttl=30)
            waiter = asyncio.create_task(locks.acquire(key, ttl=30, timeout=5))

            async def release_later():
                await asyncio.sleep(rng.uniform(0, 0.03))
                await holder.release()

            releaser = asyncio.create_task(release_later())
            await asyncio.sleep(rng.uniform(0, 0.03))
            waiter.cancel()
            try:
                lease = await waiter
                granted += 1
                await lease.release()
            except asyncio.CancelledError:
                cancelled += 1
            await releaser
            deadline = time.monotonic() + 2
            while holder_of(sync, key) is not None or server.info("waiters") != 0:
                assert time.monotonic() < deadline, f"round {round_}: left {holder_of(sync, key)}"
                await asyncio.sleep(0.01)
        assert cancelled > 0
        await locks.aclose()
        await r.aclose()

    run(main())
