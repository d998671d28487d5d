"""A renewal that hangs (a server that stopped answering) delays no other
lease's renewal, and its own lease is lost when its validity ends, not when
the hung call returns (with redis-py's default of no socket timeout it never
does). Both clients: the blocking one renews on a background thread shared
by every lease of the process, the asyncio one in a task per lease."""

from __future__ import annotations

import asyncio
import threading
import time

import redis
import redis.asyncio as aredis

from conftest import Server, Stall
from redis_lock_client import Locks
from redis_lock_client.asyncio import Locks as AsyncLocks

#: How long the healthy lease is watched while the other server hangs: a
#: dozen of its renewal periods (a third of its 1 s TTL).
WATCH_S = 4.0


def test_a_renewal_hung_on_one_server_delays_no_other_lease(server):
    other = Server()
    stall = Stall(other.port)
    try:
        healthy_locks = Locks(server.client())
        # redis-py's defaults: no socket timeout, so a renewal sent to the
        # stalled relay waits for ever.
        hung_locks = Locks(redis.Redis(port=stall.port))
        hung = [hung_locks.acquire(f"far:{i}", ttl=1.5) for i in range(3)]
        healthy = healthy_locks.acquire("near", ttl=1.0)
        assert healthy is not None and all(hung)
        stall.stall()
        lost_at = {}

        def watch(i: int) -> None:
            if hung[i].lost.wait(WATCH_S + 5):
                lost_at[i] = time.monotonic()

        watchers = [threading.Thread(target=watch, args=(i,)) for i in range(len(hung))]
        for w in watchers:
            w.start()
        end = time.monotonic() + WATCH_S
        while time.monotonic() < end:
            assert not healthy.lost.is_set(), "the healthy lease was lost"
            assert healthy.is_valid(), "the healthy lease's renewals came late"
            time.sleep(0.05)
        for w in watchers:
            w.join()
        for i, lease in enumerate(hung):
            # Lost once its validity ran out, though its renewal never
            # returned; not when the hung call ends (never, here).
            assert i in lost_at, "a lease whose renewal hangs is lost at its validity's end"
            assert lost_at[i] < lease.valid_until + 2.0
            assert not lease.is_valid()
        assert healthy.release() is True
    finally:
        stall.close()
        other.stop()


def test_async_a_renewal_hung_on_one_server_delays_no_other_lease(server):
    other = Server()
    stall = Stall(other.port)

    async def main():
        near = aredis.Redis(port=server.port)
        far = aredis.Redis(port=stall.port)  # no socket timeout: a hung call waits for ever
        healthy_locks, hung_locks = AsyncLocks(near), AsyncLocks(far)
        hung = [await hung_locks.acquire(f"far:{i}", ttl=1.5) for i in range(3)]
        healthy = await healthy_locks.acquire("near", ttl=1.0)
        assert healthy is not None and all(hung)
        stall.stall()
        lost_at = {}

        async def watch(i: int) -> None:
            try:
                await asyncio.wait_for(hung[i].lost.wait(), WATCH_S + 5)
                lost_at[i] = time.monotonic()
            except asyncio.TimeoutError:
                pass

        watchers = [asyncio.create_task(watch(i)) for i in range(len(hung))]
        end = time.monotonic() + WATCH_S
        while time.monotonic() < end:
            assert not healthy.lost.is_set(), "the healthy lease was lost"
            assert healthy.is_valid(), "the healthy lease's renewals came late"
            await asyncio.sleep(0.05)
        await asyncio.gather(*watchers)
        for i, lease in enumerate(hung):
            assert i in lost_at, "a lease whose renewal hangs is lost at its validity's end"
            assert lost_at[i] < lease.valid_until + 2.0
            assert not lease.is_valid()
        assert await healthy.release() is True
        stall.close()
        await healthy_locks.aclose()
        await hung_locks.aclose()
        await near.aclose()
        await far.aclose()

    try:
        asyncio.run(asyncio.wait_for(main(), 60))
    finally:
        stall.close()
        other.stop()
