"""The blocking client against a real server with the module."""

from __future__ import annotations

import os
import queue
import random
import signal
import threading
import time

import pytest
import redis

from redis_lock_client import (Leader, LockLost, Locks, ModuleMissing, NotAcquired, NotHeld,
                               StaleFence)


def holder_of(r: redis.Redis, key: str):
    info = r.execute_command("LOCK.INFO", key)
    if info is None:
        return None
    # A map on RESP3 (redis-py 8's default), a flat array on RESP2.
    fields = info if isinstance(info, dict) else dict(zip(info[0::2], info[1::2]))
    return fields[b"token"].decode(), fields[b"fence"]


def test_acquire_gives_a_fence_and_release_frees_it(server):
    r = server.client()
    locks = Locks(r)
    lease = locks.acquire("order:42", ttl=30)
    assert lease is not None
    assert isinstance(lease.fence, int) and lease.fence > 10**15
    assert holder_of(r, "order:42") == (lease.token, lease.fence)
    assert locks.acquire("order:42", ttl=30) is None, "held by another"
    assert lease.release() is True
    assert holder_of(r, "order:42") is None
    again = locks.acquire("order:42", ttl=30)
    assert again.fence > lease.fence, "fences rise"
    again.release()


def test_a_wait_stands_in_the_servers_line_and_is_handed_the_lock(server):
    r = server.client()
    locks = Locks(r)
    first = locks.acquire("job", ttl=30)
    got = {}

    def waiter():
        got["lease"] = locks.acquire("job", ttl=30, timeout=10)

    t = threading.Thread(target=waiter)
    t.start()
    deadline = time.monotonic() + 5
    while server.info("waiters") != 1:
        assert time.monotonic() < deadline, "the waiter queued in the server"
        time.sleep(0.01)
    released_at = time.monotonic()
    first.release()
    t.join()
    lease = got["lease"]
    assert lease is not None and lease.fence > first.fence
    assert time.monotonic() - released_at < 1.0, "handed over at once, no polling"
    assert server.info("handoffs") == 1
    lease.release()
    # A wait that runs out: None, and no place left in line.
    held = locks.acquire("job", ttl=30)
    assert locks.acquire("job", ttl=30, timeout=0.2) is None
    assert server.info("waiters") == 0
    held.release()


def test_lock_context_releases_and_raises_when_not_granted(server):
    r = server.client()
    locks = Locks(r)
    with locks.lock("k", ttl=30) as lease:
        assert holder_of(r, "k") == (lease.token, lease.fence)
        with pytest.raises(NotAcquired):
            with locks.lock("k", ttl=30, timeout=0.1):
                pass
    assert holder_of(r, "k") is None


def test_renewal_keeps_a_short_lease_and_the_lost_event_stays_clear(server):
    r = server.client()
    locks = Locks(r)
    with locks.lock("renewed", ttl=0.3) as lease:
        time.sleep(1.0)
        assert not lease.lost.is_set()
        assert lease.is_valid()
        assert holder_of(r, "renewed") == (lease.token, lease.fence)
    assert server.info("extends") >= 2


def test_a_lease_that_runs_out_sets_lost_before_the_server_ends_it_and_the_block_raises(server):
    r = server.client()
    locks = Locks(r, renew=False)
    with pytest.raises(LockLost):
        sent = time.monotonic()
        with locks.lock("short", ttl=0.3) as lease:
            # Set at the validity's end, which is before the server's lease
            # (sent + ttl at the latest) ends: the holder hears first.
            assert lease.valid_until < sent + 0.3
            assert lease.lost.wait(2), "lost is set"
    # A renewal the server refuses: lost at once.
    locks = Locks(r)
    lease = locks.acquire("taken", ttl=0.6)
    r.delete("taken")
    assert lease.lost.wait(2)
    assert lease.extend() is False


def test_exec_and_fenced_write_only_for_the_current_holder(server):
    r = server.client()
    locks = Locks(r, renew=False)
    old = locks.acquire("doc", ttl=0.2)
    assert old.exec("SET", "doc:body", "v1") == b"OK"
    assert old.fenced("doc:gate", "SET", "doc:copy", "v1") == b"OK"
    time.sleep(0.35)
    with pytest.raises(NotHeld):
        old.exec("SET", "doc:body", "stale")
    new = locks.acquire("doc", ttl=30)
    assert new.fenced("doc:gate", "SET", "doc:copy", "v2") == b"OK"
    with pytest.raises(StaleFence) as e:
        old.fenced("doc:gate", "SET", "doc:copy", "stale")
    assert (e.value.fence, e.value.mark) == (old.fence, new.fence)
    assert r.get("doc:body") == b"v1" and r.get("doc:copy") == b"v2"
    # Data on another node: the gate there.
    assert new.fenced("doc:gate2", client=r) is None or True
    new.release()


def test_lock_all_takes_every_key_or_none_with_one_fence(server):
    r = server.client()
    locks = Locks(r)
    with locks.lock_all(["{o}a", "{o}b"], ttl=30) as lease:
        assert holder_of(r, "{o}a") == holder_of(r, "{o}b") == (lease.token, lease.fence)
        assert locks.acquire_all(["{o}b", "{o}c"], ttl=30) is None
        assert r.exists("{o}c") == 0, "all or nothing"
    assert holder_of(r, "{o}a") is None and holder_of(r, "{o}b") is None


def test_readers_share_a_key_and_a_limit_makes_a_semaphore(server):
    r = server.client()
    locks = Locks(r)
    r1 = locks.acquire("report", ttl=30, shared=True)
    r2 = locks.acquire("report", ttl=30, shared=True)
    assert r1 and r2 and r1.fence != r2.fence
    assert locks.acquire("report", ttl=30) is None, "the writer waits"
    p = [locks.acquire("sem", ttl=30, limit=2) for _ in range(3)]
    assert p[0] and p[1] and p[2] is None
    for lease in (r1, r2, p[0], p[1]):
        lease.release()


def test_synchronized_runs_the_function_under_the_lock(server):
    r = server.client()
    locks = Locks(r)
    seen = []

    @locks.synchronized("sync:k", ttl=30)
    def work(x):
        seen.append(holder_of(r, "sync:k") is not None)
        return x * 2

    assert work(21) == 42
    assert seen == [True]
    assert holder_of(r, "sync:k") is None
    with pytest.raises(TypeError):
        @locks.synchronized("k")
        async def coroutine():
            pass


def test_a_server_without_the_module_says_how_to_load_it(plain_server):
    locks = Locks(plain_server.client())
    with pytest.raises(ModuleMissing) as e:
        locks.acquire("k", ttl=30)
    assert "--loadmodule" in str(e.value) and str(plain_server.port) in str(e.value)


def test_bad_arguments_are_refused_before_anything_is_sent(server):
    locks = Locks(server.client())
    for bad in (0, -1, float("nan"), float("inf")):
        with pytest.raises(ValueError):
            locks.acquire("k", ttl=bad)
    with pytest.raises(ValueError):
        locks.acquire("", ttl=1)
    with pytest.raises(ValueError):
        locks.acquire_all(["a", "a"], ttl=1)
    with pytest.raises(ValueError):
        locks.acquire("k", ttl=1, limit=0)
    assert server.client().dbsize() == 0


WAITER = """
import signal, sys, redis
from redis_lock_client import Locks
# As an interactive program has it: a test run in the background of a
# shell (make test) starts with SIGINT ignored, which Python keeps.
signal.signal(signal.SIGINT, signal.default_int_handler)
locks = Locks(redis.Redis(port=int(sys.argv[1])))
print("waiting", flush=True)
lease = None
try:
    lease = locks.acquire(sys.argv[2], ttl=30, timeout=5)
    print("granted" if lease else "not granted", flush=True)
    if lease:
        lease.release()  # what it knows it holds, it lets go
except KeyboardInterrupt:
    if lease:
        lease.release()
    print("interrupted", flush=True)
"""


def test_ctrl_c_while_waiting_leaves_no_lock_and_no_place_in_line(server):
    """A program waiting for the lock gets Ctrl-C (SIGINT) at random
    moments, while the holder releases at random moments, and ends: never
    a lock left, never a waiter."""
    import subprocess
    import sys

    r = server.client()
    locks = Locks(r)
    rng = random.Random(os.environ.get("PY_SEED", str(time.time_ns())))
    interrupted = 0
    for round_ in range(20):
        key = f"ctrl-c:{round_}"
        holder = locks.acquire(key, ttl=30)
        waiter = subprocess.Popen([sys.executable, "-c", WAITER, str(server.port), key],
                                  stdout=subprocess.PIPE, text=True)
        assert waiter.stdout.readline().strip() == "waiting"
        deadline = time.monotonic() + 5
        while server.info("waiters") != 1:
            assert time.monotonic() < deadline, "the waiter queued"
            time.sleep(0.002)
        release = threading.Timer(rng.uniform(0.0, 0.01), holder.release)
        release.start()
        time.sleep(rng.uniform(0.0, 0.01))
        waiter.send_signal(signal.SIGINT)
        out, _ = waiter.communicate(timeout=20)
        interrupted += "interrupted" in out
        release.join()
        deadline = time.monotonic() + 2
        while holder_of(r, key) is not None or server.info("waiters") != 0:
            assert time.monotonic() < deadline, f"round {round_}: left {holder_of(r, key)} ({out!r})"
            time.sleep(0.01)
    assert interrupted > 0


def test_a_cluster_client_locks_and_writes_guarded(server_factory=None):
    from conftest import Server

    node = Server(args=["--cluster-enabled", "yes"])
    try:
        r = redis.Redis(port=node.port)
        r.execute_command("CLUSTER", "ADDSLOTSRANGE", 0, 16383)
        deadline = time.monotonic() + 10
        while b"cluster_state:ok" not in r.execute_command("CLUSTER", "INFO"):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        rc = redis.RedisCluster(host="127.0.0.1", port=node.port)
        locks = Locks(rc)
        with locks.lock("{c}lock", ttl=30, timeout=5) as lease:
            assert lease.exec("SET", "{c}data", "x") == b"OK"
            assert locks.acquire("{c}lock", ttl=30, timeout=0.1) is None
        assert rc.get("{c}data") == b"x"
        rc.close()
    finally:
        node.stop()


def test_on_a_three_node_cluster_each_key_locks_waits_and_observes_on_its_node(cluster):
    """Every key on its own master: the grant, the wait in line (on that
    node's server), the renewal, the guarded write and the observer all go
    to the key's node; a lock's keys share a slot."""
    from conftest import keys_on_each_node

    rc = redis.RedisCluster(host="127.0.0.1", port=cluster[0].port)
    locks = Locks(rc)
    for node, key in zip(cluster, keys_on_each_node(rc, cluster, "job")):
        first = locks.acquire(key, ttl=5)
        got = queue.Queue()
        t = threading.Thread(target=lambda: got.put(locks.acquire(key, ttl=5, timeout=5)))
        t.start()
        eventually(lambda: node.info("waiters") == 1, what=f"{key} waits on its node")
        assert first.release() is True
        t.join(5)
        second = got.get(timeout=1)
        assert second.fence > first.fence
        data = "{" + key + "}data"
        assert second.exec("SET", data, "x") == b"OK"
        assert redis.Redis(port=node.port).get(data) == b"x"
        assert second.release() is True
    with locks.lock("{t}renewed", ttl=0.6) as lease:
        time.sleep(1.0)  # renewals ran on the key's node
        assert lease.is_valid()
    both = locks.acquire_all(["{t}a", "{t}b"], ttl=5)
    assert both.release() is True
    leader_key = keys_on_each_node(rc, cluster, "leader")[2]
    with locks.campaign(leader_key, "v1", ttl=5) as lead:
        assert locks.leader(leader_key) == Leader(lead.fence, b"v1")
        with locks.observe(leader_key) as changes:
            assert next(changes) == Leader(lead.fence, b"v1")
            lead.proclaim("v2")
            assert next(changes) == Leader(lead.fence, b"v2")
    locks.close()
    rc.close()


# ---- leader election ----


def observer_ids(r: redis.Redis):
    """The ids of the connections whose last command was LOCK.OBSERVE."""
    return [c["id"] for c in r.client_list() if c.get("cmd") == "lock.observe"]


def blocked_clients(r: redis.Redis) -> int:
    return int(r.info("clients")["blocked_clients"])


def eventually(check, within: float = 5, what: str = "") -> None:
    deadline = time.monotonic() + within
    while not check():
        assert time.monotonic() < deadline, what or "not in time"
        time.sleep(0.01)


class Pump:
    """An observer read by a thread of its own: ``get(within)`` is its next
    item, or the NOTHING marker when none came within that long."""

    NOTHING = object()

    def __init__(self, observer) -> None:
        self.observer = observer
        self.items: queue.Queue = queue.Queue()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            for item in self.observer:
                self.items.put(item)
        except Exception as e:  # noqa: BLE001
            self.items.put(e)

    def get(self, within: float = 5):
        try:
            item = self.items.get(timeout=within)
        except queue.Empty:
            return Pump.NOTHING
        if isinstance(item, Exception):
            raise item
        return item


def test_a_user_with_only_the_lock_commands_locks_waits_renews_and_observes(server):
    """The library sends nothing but LOCK.* commands: an ACL user with only
    those (no INFO, no CLIENT) can use every part it is given."""
    from conftest import LOCK_ONLY_USER

    admin = server.client()
    admin.execute_command("ACL", "SETUSER", "app", "on", ">pw", *LOCK_ONLY_USER)
    locks = Locks(server.client(username="app", password="pw"))
    first = locks.acquire("app:k", ttl=5)
    got = queue.Queue()
    t = threading.Thread(target=lambda: got.put(locks.acquire("app:k", ttl=5, timeout=5)))
    t.start()
    eventually(lambda: server.info("waiters") == 1, what="the waiter waits in line")
    assert first.release() is True
    t.join(5)
    second = got.get(timeout=1)
    assert second.fence > first.fence
    assert second.release() is True
    with locks.lock("app:renewed", ttl=0.6) as lease:
        time.sleep(1.0)  # renewals ran
        assert lease.is_valid()
    both = locks.acquire_all(["app:a", "app:b"], ttl=5)
    assert both.release() is True
    with locks.campaign("app:leader", "v1", ttl=5) as lead:
        assert locks.leader("app:leader") == Leader(lead.fence, b"v1")
        with locks.observe("app:leader") as changes:
            assert next(changes) == Leader(lead.fence, b"v1")
    locks.close()
    assert not any("NOPERM" in line for line in server.log().splitlines())


def test_fenced_writes_to_a_gate_on_another_server(server):
    """The lock on one server, the protected data behind a gate on
    another: ``fenced(..., client=)`` sends the write there, with this
    grant's fence; an older grant's write is refused there."""
    from conftest import Server

    store = Server()
    try:
        data = store.client()
        locks = Locks(server.client())
        old = locks.acquire("doc", ttl=30)
        assert old.fenced("doc:gate", "SET", "doc:copy", "v1", client=data) == b"OK"
        assert old.release() is True
        new = locks.acquire("doc", ttl=30)
        assert new.fence > old.fence
        assert new.fenced("doc:gate", "SET", "doc:copy", "v2", client=data) == b"OK"
        with pytest.raises(StaleFence) as refused:
            old.fenced("doc:gate", "SET", "doc:copy", "stale", client=data)
        assert (refused.value.fence, refused.value.mark) == (old.fence, new.fence)
        assert data.get("doc:copy") == b"v2"
        assert server.client().get("doc:copy") is None, "nothing written beside the lock"
        assert new.release() is True
        locks.close()
    finally:
        store.stop()


def test_close_ends_the_background_releases_of_failed_waits(server):
    """A wait whose connection is killed fails, and leaves releases due
    later (a grant may have been on its way); closing the Locks right
    after, and the client with it, must not let them run on: they would
    open a new connection on the closed client and leave it open. Each
    token is released once more at the close."""
    from redis_lock_client import _common as c

    sync = server.client()
    r = server.client()
    locks = Locks(r)
    keys = [f"undo:{i}" for i in range(5)]
    for key in keys:
        holder = locks.acquire(key, ttl=30)
        failed = queue.Queue()

        def wait(key=key):
            try:
                locks.acquire(key, ttl=30, timeout=5)
                failed.put(None)
            except Exception as e:  # noqa: BLE001
                failed.put(e)

        t = threading.Thread(target=wait)
        t.start()
        eventually(lambda: server.info("waiters") == 1, what="the waiter waits")
        sync.execute_command("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes")
        t.join(5)
        assert isinstance(failed.get(timeout=1), redis.ConnectionError)
        holder.release()
    locks.close()
    r.close()
    time.sleep(max(c.UNDO_AGAIN_S) + 0.5)
    left = [cl for cl in sync.client_list() if cl.get("cmd") != "client|list"]
    assert left == [], f"connections left after close: {left}"
    assert all(holder_of(sync, key) is None for key in keys)


def test_closing_an_observer_from_another_thread_ends_its_wait_at_once(server):
    # Closed at random moments of its rounds (connecting, the first read,
    # the wait's send, the wait itself): the reading thread must end each time within
    # a second, never by its 35 s bound (redis-py's can_read reopens a
    # connection closed under it and would wait on that one).
    r = server.client()
    locks = Locks(r)
    a = locks.campaign("closing", "v", ttl=5)
    rng = random.Random(7)
    for _ in range(30):
        observer = locks.observe("closing")
        pump = Pump(observer)
        time.sleep(rng.uniform(0, 0.02))
        observer.close()
        pump.thread.join(1.0)
        assert not pump.thread.is_alive(), "a close ends the iteration at once"
    # Nor is a connection left open: one a close found still connecting
    # (closed under it, it connected after) is closed by its round.
    eventually(lambda: blocked_clients(r) == 0 and observer_ids(r) == [],
               what="no closed observer's connection left open")
    assert a.release() is True


def test_a_campaign_waits_in_line_and_leads_when_the_leader_resigns(server):
    r = server.client()
    locks = Locks(r)
    assert locks.leader("election") is None
    a = locks.campaign("election", "node-a", ttl=30)
    assert a.value == "node-a" and a.fence > 10**15
    assert locks.leader("election") == Leader(a.fence, b"node-a")
    got = {}
    t = threading.Thread(target=lambda: got.update(b=locks.campaign("election", "node-b")))
    t.start()
    eventually(lambda: server.info("waiters") == 1, what="the candidate waits in the server's line")
    assert a.release() is True
    t.join(10)
    b = got["b"]
    assert b.fence > a.fence and b.value == "node-b"
    assert locks.leader("election") == Leader(b.fence, b"node-b")
    # A client that decodes reads the value as str.
    assert Locks(server.client(decode_responses=True)).leader("election") == Leader(b.fence, "node-b")
    with b:
        pass  # resigns on exit
    assert locks.leader("election") is None


def test_a_campaign_not_granted_in_time_raises_and_leaves_no_place_in_line(server):
    locks = Locks(server.client())
    with locks.campaign("election", "node-a") as a:
        with pytest.raises(NotAcquired):
            locks.campaign("election", "node-b", timeout=0)
        started = time.monotonic()
        with pytest.raises(NotAcquired):
            locks.campaign("election", "node-b", timeout=0.2)
        assert time.monotonic() - started >= 0.15
        assert server.info("waiters") == 0
        assert locks.leader("election") == Leader(a.fence, b"node-a")
    with pytest.raises(TypeError):
        locks.campaign("election", None)


def test_a_proclaim_is_seen_by_an_observer_and_renewals_keep_the_value(server):
    r = server.client()
    locks = Locks(r)
    a = locks.campaign("election", "v1", ttl=0.6)  # renewed every 0.2 s
    with locks.observe("election") as observer:
        pump = Pump(observer)
        assert pump.get() == Leader(a.fence, b"v1"), "the first item is the state now"
        a.proclaim("v2")
        assert a.value == "v2"
        assert pump.get() == Leader(a.fence, b"v2")
        assert locks.leader("election") == Leader(a.fence, b"v2")
        # Renewals (LOCK.EXTEND) keep the value and tell observers nothing.
        assert pump.get(within=1.0) is Pump.NOTHING
        assert a.is_valid() and locks.leader("election") == Leader(a.fence, b"v2")
        assert a.release() is True
        assert pump.get() is None, "a resignation: vacant"
        with pytest.raises(LockLost):
            a.proclaim("v3")
    pump.thread.join(5)
    assert not pump.thread.is_alive(), "closing ends the iteration"


def test_a_proclaim_after_the_lease_ended_is_lost_and_grants_nothing(server):
    r = server.client()
    locks = Locks(r)
    # The lease ends in the server while this client still counts it held.
    a = locks.campaign("election", "v1")
    # A value above lock.max-value-len: the server's error, nothing changes.
    with pytest.raises(redis.ResponseError, match="max-value-len"):
        a.proclaim("x" * 5000)
    assert a.is_valid() and a.value == "v1"
    assert locks.leader("election") == Leader(a.fence, b"v1")
    assert r.execute_command("LOCK.RELEASE", "election", a.token) == 1
    grants = server.info("grants")
    with pytest.raises(LockLost):
        a.proclaim("v2")
    assert server.info("grants") == grants, "LOCK.EXTEND: no grant, not one given back"
    assert a.lost.is_set() and not a.is_valid()
    assert a.value == "v1"
    assert r.execute_command("LOCK.INFO", "election") is None, "the free key stays free"
    assert locks.leader("election") is None
    # Again, with the key taken by another meanwhile: it stays theirs.
    a = locks.campaign("election", "v1")
    assert r.execute_command("LOCK.RELEASE", "election", a.token) == 1
    b = locks.campaign("election", "b")
    with pytest.raises(LockLost):
        a.proclaim("v2")
    assert a.lost.is_set()
    assert holder_of(r, "election") == (b.token, b.fence)
    assert locks.leader("election") == Leader(b.fence, b"b")
    assert b.release() is True


def observe_calls(r) -> int:
    stats = r.info("commandstats").get("cmdstat_lock.observe", {})
    return int(stats.get("calls", 0))


def test_an_observer_of_a_value_it_cannot_decode_waits_without_spinning(server):
    """With ``decode_responses`` (and ``encoding_errors="replace"``), a
    value that is not UTF-8 reads back as other bytes than the server's, so
    a wait naming it would be answered at once for ever: the observer then
    waits on the fence alone. It is still told of the next change."""
    r = server.client(decode_responses=True, encoding_errors="replace")
    admin = server.client()
    locks = Locks(r)
    # A Lua string escape makes the byte 0xff: a writer's binary value.
    fence = admin.eval(
        "return redis.call('LOCK.ACQUIRE', KEYS[1], 'tok', '60000', 'VALUE', '\\255a')",
        1, "election")
    with locks.observe("election") as observer:
        pump = Pump(observer)
        assert pump.get() == Leader(fence, "\ufffda")
        before = observe_calls(admin)
        assert pump.get(within=1.0) is Pump.NOTHING, "nothing changed"
        assert observe_calls(admin) - before < 10, "no loop of waits answered at once"
        assert admin.execute_command("LOCK.RELEASE", "election", "tok") == 1
        assert pump.get() is None, "told of the vacancy"


def test_an_observer_is_told_when_a_lease_ends_with_no_command(server):
    locks = Locks(server.client(), renew=False)
    with locks.observe("election") as observer:
        pump = Pump(observer)
        assert pump.get() is None, "vacant at first"
        a = locks.campaign("election", "v1", ttl=0.5)
        assert pump.get() == Leader(a.fence, b"v1")
        started = time.monotonic()
        assert pump.get(within=10) is None, "the lease ended: vacant"
        # Generous: the lease was 0.5 s; a loaded machine may be slow.
        assert time.monotonic() - started < 5


def test_closing_an_observer_leaves_no_blocked_client(server):
    r = server.client()
    locks = Locks(r)
    lease = locks.campaign("election", "v1")
    observer = locks.observe("election")
    pump = Pump(observer)
    assert pump.get() == Leader(lease.fence, b"v1")
    eventually(lambda: blocked_clients(r) == 1, what="the observer blocks in the server")
    observer.close()  # from another thread than the one waiting in it
    pump.thread.join(5)
    assert not pump.thread.is_alive()
    eventually(lambda: blocked_clients(r) == 0, what="no blocked client left")
    eventually(lambda: observer_ids(r) == [], what="its connection is closed")
    # Dropped without close: its connection goes too.
    observer = locks.observe("election")
    assert next(observer) == Leader(lease.fence, b"v1")
    assert len(observer_ids(r)) == 1
    del observer
    eventually(lambda: observer_ids(r) == [], what="a dropped observer's connection is closed")
    lease.release()


def test_an_observer_replaces_a_connection_that_went_quiet(server):
    # Its connection stays open but carries nothing (a host gone, a NAT
    # that forgot the flow): redis-py's default socket_timeout is none, so
    # without a bound of its own it waited for ever and missed the leader.
    from conftest import Stall

    proxy = Stall(server.port)
    try:
        r = server.client()
        locks = Locks(r)
        with Locks(redis.Redis(port=proxy.port)).observe("election", check_interval=0.2) as observer:
            pump = Pump(observer)
            assert pump.get() is None, "vacant at first"
            eventually(lambda: blocked_clients(r) == 1, what="the observer waits in the server")
            proxy.silence()
            a = locks.campaign("election", "v1")
            # The wait (0.2 s) and the grace (5 s), then a new connection.
            assert pump.get(within=20) == Leader(a.fence, b"v1"), "told through a new connection"
            assert proxy.connections() >= 2
            a.release()
            assert pump.get() is None
    finally:
        proxy.close()


def test_an_observers_check_interval_is_checked(server):
    locks = Locks(server.client())
    for bad in (0, -1, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="check_interval"):
            locks.observe("election", check_interval=bad)
    with pytest.raises(TypeError, match="check_interval"):
        locks.observe("election", check_interval="30")  # type: ignore[arg-type]


def test_an_observer_resumes_after_its_connection_is_killed_without_a_repeat_or_a_miss(server):
    r = server.client()
    locks = Locks(r)
    a = locks.campaign("election", "v1")
    with locks.observe("election") as observer:
        assert next(observer) == Leader(a.fence, b"v1")
        # Killed while idle, and a change made while it is disconnected.
        [oid] = observer_ids(r)
        r.client_kill_filter(_id=oid)
        a.proclaim("v2")
        assert next(observer) == Leader(a.fence, b"v2"), "the change made meanwhile, once"
        pump = Pump(observer)
        eventually(lambda: blocked_clients(r) == 1, what="the observer blocks again")
        assert pump.get(within=0.5) is Pump.NOTHING, "no repeat"
        # Killed while it waits in the server, and a change at once.
        [oid] = observer_ids(r)
        r.client_kill_filter(_id=oid)
        assert a.release() is True
        assert pump.get() is None, "the resignation, once"
        assert pump.get(within=0.5) is Pump.NOTHING, "no repeat"
        b = locks.campaign("election", "v3")
        assert pump.get() == Leader(b.fence, b"v3")
        b.release()
        assert pump.get() is None


def test_a_client_on_another_database_waits_in_that_databases_line(server):
    """A client with ``db=3``: the lock, its wait (on a connection of its
    own) and the hand-off are db 3's; db 0 is never touched."""
    r = server.client(db=3)
    locks = Locks(r)
    first = locks.acquire("k", ttl=30)
    assert locks.acquire("k", ttl=30, timeout=0.3) is None, "waited in db 3's line"
    got = {}
    waiter = threading.Thread(target=lambda: got.setdefault("lease", locks.acquire("k", ttl=30, timeout=10)))
    waiter.start()
    deadline = time.monotonic() + 10
    while server.info("waiters") != 1:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert first.release() is True
    waiter.join()
    assert got["lease"].fence > first.fence
    assert server.client(db=0).keys() == [] and r.keys() == [b"k"]
    assert got["lease"].release() is True
    locks.close()
