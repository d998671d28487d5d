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

from redis_lock_client import _common as c

from redis_lock_client.asyncio import (Leader, LockLost, Locks, ModuleMissing, NotAcquired,
                                       NotHeld, StaleFence)


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


def test_async_a_user_with_only_the_lock_commands_locks_waits_renews_and_observes(server):
    from conftest import LOCK_ONLY_USER

    server.client().execute_command("ACL", "SETUSER", "app", "on", ">pw", *LOCK_ONLY_USER)

    async def main():
        r = aredis.Redis(port=server.port, username="app", password="pw")
        locks = Locks(r)
        first = await locks.acquire("app:k", ttl=5)
        waiter = asyncio.ensure_future(locks.acquire("app:k", ttl=5, timeout=5))
        await eventually(lambda: server.info("waiters") == 1, what="the waiter waits in line")
        assert await first.release() is True
        second = await asyncio.wait_for(waiter, 5)
        assert second.fence > first.fence
        assert await second.release() is True
        async with locks.lock("app:renewed", ttl=0.6) as lease:
            await asyncio.sleep(1.0)  # renewals ran
            assert lease.is_valid()
        lead = await locks.campaign("app:leader", "v1", ttl=5)
        assert await locks.leader("app:leader") == Leader(lead.fence, b"v1")
        async with locks.observe("app:leader") as changes:
            assert await changes.__anext__() == Leader(lead.fence, b"v1")
        assert await lead.release() is True
        await locks.aclose()
        await r.aclose()

    run(main())


def test_async_on_a_three_node_cluster_each_key_locks_waits_and_observes_on_its_node(cluster):
    from conftest import keys_on_each_node

    sync_rc = redis.RedisCluster(host="127.0.0.1", port=cluster[0].port)
    keys = keys_on_each_node(sync_rc, cluster, "job")
    leader_key = keys_on_each_node(sync_rc, cluster, "leader")[1]
    sync_rc.close()

    async def main():
        rc = aredis.RedisCluster(host="127.0.0.1", port=cluster[0].port)
        locks = Locks(rc)
        for node, key in zip(cluster, keys):
            first = await locks.acquire(key, ttl=5)
            waiter = asyncio.ensure_future(locks.acquire(key, ttl=5, timeout=5))
            await eventually(lambda: node.info("waiters") == 1, what=f"{key} waits on its node")
            assert await first.release() is True
            second = await asyncio.wait_for(waiter, 5)
            assert second.fence > first.fence
            data = "{" + key + "}data"
            assert await second.exec("SET", data, "x") == b"OK"
            assert redis.Redis(port=node.port).get(data) == b"x"
            assert await second.release() is True
        async with locks.lock("{t}renewed", ttl=0.6) as lease:
            await asyncio.sleep(1.0)
            assert lease.is_valid()
        lead = await locks.campaign(leader_key, "v1", ttl=5)
        assert await locks.leader(leader_key) == Leader(lead.fence, b"v1")
        async with locks.observe(leader_key) as changes:
            assert await changes.__anext__() == Leader(lead.fence, b"v1")
            await lead.proclaim("v2")
            assert await asyncio.wait_for(changes.__anext__(), 5) == Leader(lead.fence, b"v2")
        assert await lead.release() is True
        await locks.aclose()
        await rc.aclose()

    run(main())


def test_a_release_cancelled_while_it_stops_the_renewals_is_cancelled(server):
    """A cancel that comes while release() waits for the renewal task to
    stop is the caller's (asyncio.timeout, a TaskGroup): it propagates,
    nothing is released, and release() may be called again."""
    sync = server.client()

    async def main():
        locks = Locks(aredis.Redis(port=server.port))
        lease = await locks.acquire("cancel-release", ttl=30)
        task = asyncio.ensure_future(lease.release())
        await asyncio.sleep(0)  # in release, waiting for the renewals to stop
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert holder_of(sync, "cancel-release") == (lease.token, lease.fence)
        assert await lease.release() is True
        assert holder_of(sync, "cancel-release") is None
        await locks.aclose()

    run(main())


def test_aclose_ends_the_background_releases_of_cancelled_waits(server):
    """Cancelled waits leave releases due later (in case a grant was on its
    way); closing the Locks right after, and the client with it, must not
    let them run on: they would open a new connection on the closed client
    and leave it open. Each token is released once more at the close."""
    sync = server.client()

    async def main():
        r = aredis.Redis(port=server.port)
        locks = Locks(r)
        keys = [f"undo:{i}" for i in range(10)]
        for key in keys:
            holder = await locks.acquire(key, ttl=30)
            waiter = asyncio.create_task(locks.acquire(key, ttl=30, timeout=5))
            await eventually(lambda: server.info("waiters") == 1, what="the waiter waits")
            waiter.cancel()
            with pytest.raises(asyncio.CancelledError):
                await waiter
            await holder.release()
        await locks.aclose()
        await r.aclose()
        await asyncio.sleep(max(c.UNDO_AGAIN_S) + 0.5)
        left = [cl for cl in sync.client_list() if cl.get("cmd") != "client|list"]
        assert left == [], f"connections left after aclose: {left}"
        assert all(holder_of(sync, key) is None for key in keys)

    run(main())


# ---- leader election ----


def observer_ids(r: redis.Redis):
    return [c["id"] for c in r.client_list() if c.get("cmd") == "lock.observe"]


def blocked_clients(r: redis.Redis) -> int:
    return int(r.info("clients")["blocked_clients"])


async def eventually(check, within: float = 5, what: str = "") -> None:
    deadline = time.monotonic() + within
    while not check():
        assert time.monotonic() < deadline, what or "not in time"
        await asyncio.sleep(0.01)


async def _await(awaitable):
    """``locks.campaign(...)`` as a coroutine, for ``create_task``."""
    return await awaitable


async def nothing_within(task: asyncio.Future, seconds: float) -> bool:
    done, _ = await asyncio.wait({task}, timeout=seconds)
    return not done


def test_campaign_hand_off_timeout_and_leader(server):
    async def main():
        locks = Locks(aredis.Redis(port=server.port))
        assert await locks.leader("election") is None
        a = await locks.campaign("election", "node-a")
        assert a.value == "node-a"
        assert await locks.leader("election") == Leader(a.fence, b"node-a")
        with pytest.raises(NotAcquired):
            await locks.campaign("election", "node-b", timeout=0)
        with pytest.raises(NotAcquired):
            await locks.campaign("election", "node-b", timeout=0.2)
        assert server.info("waiters") == 0
        waiting = asyncio.create_task(_await(locks.campaign("election", "node-b")))
        await eventually(lambda: server.info("waiters") == 1)
        assert await a.release() is True
        b = await asyncio.wait_for(waiting, 10)
        assert b.fence > a.fence and b.value == "node-b"
        decoding = Locks(aredis.Redis(port=server.port, decode_responses=True))
        assert await decoding.leader("election") == Leader(b.fence, "node-b")
        await b.release()
        # async with: resigns on exit.
        async with locks.campaign("election", "node-c") as c:
            assert await locks.leader("election") == Leader(c.fence, b"node-c")
        assert await locks.leader("election") is None
        await locks.aclose()
        await decoding.aclose()

    run(main())



def test_async_observer_proclaim_release_and_lease_end(server):
    async def main():
        locks = Locks(aredis.Redis(port=server.port), renew=False)
        async with locks.observe("election") as observer:
            changes = observer.__aiter__()
            assert await changes.__anext__() is None, "vacant at first"
            a = await locks.campaign("election", "v1", ttl=30)
            assert await asyncio.wait_for(changes.__anext__(), 5) == Leader(a.fence, b"v1")
            await a.proclaim("v2")
            assert a.value == "v2"
            assert await asyncio.wait_for(changes.__anext__(), 5) == Leader(a.fence, b"v2")
            assert await a.release() is True
            assert await asyncio.wait_for(changes.__anext__(), 5) is None
            with pytest.raises(LockLost):
                await a.proclaim("v3")
            b = await locks.campaign("election", "v1", ttl=0.5)  # not renewed
            assert await asyncio.wait_for(changes.__anext__(), 5) == Leader(b.fence, b"v1")
            assert await asyncio.wait_for(changes.__anext__(), 10) is None, "the lease ended"
        # async for, from the state now.
        c = await locks.campaign("election", "v9", ttl=30)
        seen = []
        async with locks.observe("election") as observer:
            async for change in observer:
                seen.append(change)
                if len(seen) == 1:
                    await c.release()
                else:
                    break
        assert seen == [Leader(c.fence, b"v9"), None]
        await locks.aclose()

    run(main())


def test_async_a_proclaim_after_the_lease_ended_is_lost_and_grants_nothing(server):
    async def main():
        r = server.client()
        locks = Locks(aredis.Redis(port=server.port))
        # The lease ends in the server while this client still counts it held.
        a = await locks.campaign("election", "v1")
        assert r.execute_command("LOCK.RELEASE", "election", a.token) == 1
        grants = server.info("grants")
        with pytest.raises(LockLost):
            await a.proclaim("v2")
        assert server.info("grants") == grants, "LOCK.EXTEND: no grant, not one given back"
        assert a.lost.is_set() and not a.is_valid()
        assert a.value == "v1"
        assert r.execute_command("LOCK.INFO", "election") is None, "the free key stays free"
        # Again, with the key taken by another meanwhile: it stays theirs.
        a = await locks.campaign("election", "v1")
        assert r.execute_command("LOCK.RELEASE", "election", a.token) == 1
        b = await locks.campaign("election", "b")
        with pytest.raises(LockLost):
            await a.proclaim("v2")
        assert a.lost.is_set()
        assert holder_of(r, "election") == (b.token, b.fence)
        assert await locks.leader("election") == Leader(b.fence, b"b")
        assert await b.release() is True
        await locks.aclose()

    run(main())


def test_async_closing_or_cancelling_an_observer_leaves_no_blocked_client(server):
    r = server.client()

    async def main():
        locks = Locks(aredis.Redis(port=server.port))
        lease = await locks.campaign("election", "v1")
        observer = locks.observe("election")
        assert await observer.__anext__() == Leader(lease.fence, b"v1")
        waiting = asyncio.ensure_future(observer.__anext__())
        await eventually(lambda: blocked_clients(r) == 1, what="the observer blocks")
        # A task waiting in it cancelled: its connection closes...
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        await eventually(lambda: blocked_clients(r) == 0 and observer_ids(r) == [])
        # ... and the next item resumes, without a repeat.
        waiting = asyncio.ensure_future(observer.__anext__())
        assert await nothing_within(waiting, 0.5), "no repeat after resuming"
        await eventually(lambda: blocked_clients(r) == 1)
        # aclose from another task while one waits in it: the iteration ends.
        await observer.aclose()
        with pytest.raises(StopAsyncIteration):
            await asyncio.wait_for(waiting, 5)
        await eventually(lambda: blocked_clients(r) == 0 and observer_ids(r) == [],
                         what="no blocked client left")
        await lease.release()
        await locks.aclose()

    run(main())


def test_async_closing_an_observer_at_random_moments_ends_it_and_leaves_no_connection(server):
    # As the sync one: aclose from another task at random moments of the
    # observer's rounds (connecting, the first read, the wait's send, the
    # wait): the iterating task must end within a second each time, and no
    # connection of a closed observer may stay open (a send reconnects a
    # connection closed under it; the server would hold its wait).
    r = server.client()

    async def main():
        locks = Locks(aredis.Redis(port=server.port))
        lease = await locks.campaign("closing", "v", ttl=5)
        baseline = len(r.client_list())
        rng = random.Random(7)

        async def pump(observer):
            async for _ in observer:
                pass

        for _ in range(30):
            observer = locks.observe("closing")
            task = asyncio.ensure_future(pump(observer))
            await asyncio.sleep(rng.uniform(0, 0.02))
            await observer.aclose()
            await asyncio.wait_for(task, 1.0)
        await eventually(lambda: blocked_clients(r) == 0 and observer_ids(r) == [],
                         what="no closed observer's connection left open")
        assert len(r.client_list()) <= baseline
        await lease.release()
        await locks.aclose()

    run(main())


def test_async_observer_replaces_a_connection_that_went_quiet(server):
    # As the sync one: the wait is bounded by the observer, not by the
    # client's socket_timeout (none here).
    from conftest import Stall

    proxy = Stall(server.port)
    r = server.client()

    async def main():
        locks = Locks(aredis.Redis(port=server.port))
        async with Locks(aredis.Redis(port=proxy.port)).observe("election", check_interval=0.2) as observer:
            assert await asyncio.wait_for(observer.__anext__(), 5) is None, "vacant at first"
            waiting = asyncio.ensure_future(observer.__anext__())
            await eventually(lambda: blocked_clients(r) == 1, what="the observer waits in the server")
            proxy.silence()
            a = await locks.campaign("election", "v1")
            assert await asyncio.wait_for(waiting, 20) == Leader(a.fence, b"v1"), "told through a new connection"
            assert proxy.connections() >= 2
            await a.release()
        with pytest.raises(ValueError, match="check_interval"):
            locks.observe("election", check_interval=0)
        await locks.aclose()

    try:
        run(main())
    finally:
        proxy.close()


def test_async_observer_resumes_after_its_connection_is_killed(server):
    r = server.client()

    async def main():
        locks = Locks(aredis.Redis(port=server.port))
        a = await locks.campaign("election", "v1")
        async with locks.observe("election") as observer:
            assert await observer.__anext__() == Leader(a.fence, b"v1")
            [oid] = observer_ids(r)
            r.client_kill_filter(_id=oid)
            await a.proclaim("v2")  # while it is disconnected
            assert await asyncio.wait_for(observer.__anext__(), 5) == Leader(a.fence, b"v2")
            waiting = asyncio.ensure_future(observer.__anext__())
            await eventually(lambda: blocked_clients(r) == 1)
            assert await nothing_within(waiting, 0.5), "no repeat"
            [oid] = observer_ids(r)
            r.client_kill_filter(_id=oid)  # while it waits in the server
            await a.release()
            assert await asyncio.wait_for(waiting, 5) is None, "the resignation, once"
            waiting = asyncio.ensure_future(observer.__anext__())
            assert await nothing_within(waiting, 0.5), "no repeat"
            b = await locks.campaign("election", "v3")
            assert await asyncio.wait_for(waiting, 5) == Leader(b.fence, b"v3")
            await b.release()
        await locks.aclose()

    run(main())


def test_one_locks_serves_one_event_loop_after_another(server):
    """A Locks kept across event loops (a second ``asyncio.run``, a test
    framework's loop per test): its own wait connections are made again in
    each loop, so a blocking acquire works in every one. (The user's client
    is redis-py's: the test gives it fresh connections in each loop, as
    redis-py wants.)"""
    sync = server.client()
    r = aredis.Redis(port=server.port)
    locks = Locks(r)

    async def one_round(i):
        r.connection_pool.reset()  # redis-py's connections die with their loop
        sync.execute_command("LOCK.ACQUIRE", "loops", "other", 30000)
        waiter = asyncio.create_task(locks.acquire("loops", ttl=30, timeout=10))
        while server.info("waiters") != 1:
            await asyncio.sleep(0.01)
        assert sync.execute_command("LOCK.RELEASE", "loops", "other") == 1
        lease = await waiter
        assert lease is not None and holder_of(sync, "loops") == (lease.token, lease.fence)
        assert await lease.release() is True
        if i == 2:
            await locks.aclose()

    for i in range(3):
        run(one_round(i))
    assert server.info("handoffs") == 3


def test_a_client_on_another_database_waits_in_that_databases_line(server):
    """As the blocking client's: ``db=3`` holds for the waits too."""

    async def main():
        r = aredis.Redis(port=server.port, db=3)
        locks = Locks(r)
        first = await locks.acquire("k", ttl=30)
        assert await locks.acquire("k", ttl=30, timeout=0.3) is None, "waited in db 3's line"
        waiter = asyncio.create_task(locks.acquire("k", ttl=30, timeout=10))
        while server.info("waiters") != 1:
            await asyncio.sleep(0.01)
        assert await first.release() is True
        lease = await waiter
        assert lease.fence > first.fence
        assert server.client(db=0).keys() == [] and await r.keys() == [b"k"]
        assert await lease.release() is True
        await locks.aclose()
        await r.aclose()

    run(main())
