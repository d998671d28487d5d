"""The asyncio client: :class:`Locks` over a ``redis.asyncio.Redis`` (or
``redis.asyncio.RedisCluster``), :class:`Lease` for a held lock. The same
API as the blocking one, awaited: ``async with locks.lock("k", ttl=30) as
lease:``, ``lease.lost`` an ``asyncio.Event``. A task cancelled while it
waits leaves no lock and no place in line behind."""

from __future__ import annotations

import asyncio
import functools
import inspect
import time
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator, Callable, Dict, Generator, Optional, Sequence, Tuple, TypeVar

import redis.asyncio as aredis
from redis.backoff import NoBackoff
from redis.exceptions import RedisError

try:  # redis-py 5 has one Retry for asyncio apart
    from redis.asyncio.retry import Retry
except ImportError:  # pragma: no cover
    from redis.retry import Retry  # type: ignore[assignment]

from . import _common as c
from . import _protocol as p
from ._common import Leader
from .errors import (LockError, LockLost, ModuleMissing, NotAcquired, NotHeld,  # noqa: F401
                     StaleFence)

F = TypeVar("F", bound=Callable[..., Any])

__all__ = ["Locks", "Lease", "Leader", "Observer", "LockError", "LockLost", "ModuleMissing",
           "NotAcquired", "NotHeld", "StaleFence"]


class Lease:
    """A held lock (see :class:`redis_lock_client.Lease`); ``lost`` is an
    ``asyncio.Event``, set when the lock is lost."""

    def __init__(self, locks: "Locks", keys: c.Keys, token: str, fence: int, ttl: float,
                 started: float, renew: bool, value: Optional[c.Value] = None) -> None:
        self._locks = locks
        self._keys = keys
        self.token: str = token
        self.fence: int = int(fence)
        self.ttl: float = ttl
        #: The public value this holder stands with (``campaign``).
        self.value: Optional[c.Value] = value
        self.lost = asyncio.Event()
        self._valid_until = started + ttl - c.drift(ttl)
        self._renew = renew
        self._released = False
        # Set by release: the keeper stops at its next step even if the
        # cancel that wakes it is swallowed on the way (Python 3.11's
        # wait_for, or a client library turning it into a connection error).
        self._stopping = False
        self._next_renew = started + ttl / 3
        self._keeper = asyncio.get_running_loop().create_task(self._keep())

    def __repr__(self) -> str:  # no token: it is the holder's credential
        return f"Lease(keys={list(self._keys.names)!r}, fence={self.fence}, valid={self.is_valid()})"

    @property
    def key(self) -> str:
        return self._keys.first

    @property
    def keys(self) -> Sequence[str]:
        return self._keys.names

    @property
    def valid_until(self) -> float:
        """Until when (``time.monotonic()``) the lock is surely held."""
        return self._valid_until

    def is_valid(self) -> bool:
        return not self.lost.is_set() and time.monotonic() < self._valid_until

    async def _keep(self) -> None:
        while not self._stopping:
            wake = min(self._next_renew, self._valid_until) if self._renew else self._valid_until
            await asyncio.sleep(max(0.0, wake - time.monotonic()))
            if self._stopping:
                return
            now = time.monotonic()
            if now >= self._valid_until:
                self.lost.set()
                return
            if not self._renew or now < self._next_renew:
                continue
            started = time.monotonic()
            try:
                # Bounded by the validity: a renewal still on its way when
                # it ends (a server that stopped answering, and no socket
                # timeout) is cancelled, its connection closed, and the
                # lease lost on time, at the top of the loop.
                held = await asyncio.wait_for(self._extend_now(self.ttl),
                                              self._valid_until - started)
            except (RedisError, asyncio.TimeoutError):
                self._next_renew = time.monotonic() + min(self.ttl / 10, 0.1)
                continue
            if not held:
                self.lost.set()
                return
            self._valid_until = started + self.ttl - c.drift(self.ttl)
            self._next_renew = started + self.ttl / 3

    async def _extend_now(self, ttl: float) -> bool:
        ms = c.to_ms(ttl, "ttl")
        replies = [await self._locks._call(*args) for args in self._keys.extends(self.token, ms)]
        return all(r == 1 for r in replies)

    async def extend(self, ttl: Optional[float] = None) -> bool:
        """Sets the lease to ``ttl`` (default: its TTL) from now."""
        if self.lost.is_set():
            return False
        ttl = self.ttl if ttl is None else ttl
        started = time.monotonic()
        if not await self._extend_now(ttl):
            self.lost.set()
            return False
        self.ttl = ttl
        self._valid_until = started + ttl - c.drift(ttl)
        self._next_renew = started + ttl / 3
        return True

    async def proclaim(self, value: c.Value) -> None:
        """Changes this leader's public value (``LOCK.EXTEND key token ttl
        VALUE v``): the fence stays, the lease starts again, observers are
        told. Never a grant: :class:`LockLost` if the lock is no longer
        held (see :meth:`redis_lock_client.Lease.proclaim`)."""
        c.check_value(value)
        if len(self._keys.names) != 1 or self._keys.shared:
            raise TypeError("only a leader (one key, exclusive) has a value to proclaim")
        if self._released or self.lost.is_set():
            raise LockLost(f"the lock on {self.key} is not held: nothing to proclaim")
        ttl = self.ttl
        started = time.monotonic()
        held = await self._locks._call(*self._keys.proclaim(self.token, c.to_ms(ttl, "ttl"),
                                                            value))
        if held != 1:
            self.lost.set()
            raise LockLost(f"the lock on {self.key} was lost before the proclaim")
        self.value = value
        self._valid_until = started + ttl - c.drift(ttl)
        self._next_renew = started + ttl / 3

    async def exec(self, *command: Any) -> Any:
        """``LOCK.EXEC``: runs ``command`` only while this grant holds the
        lock (:class:`NotHeld` otherwise; nothing ran). Sent once."""
        args = c.exec_args(self._keys, self.token, self.fence, command)
        return await self._locks._send_once(self._locks._client, self._keys.first, args)

    async def fenced(self, gate: str, *command: Any, client: Any = None) -> Any:
        """``LOCK.FENCED``: runs ``command`` only if this fence is at least
        the gate's mark (:class:`StaleFence` otherwise). Sent once."""
        args = c.fenced_args(gate, self.fence, command)
        return await self._locks._send_once(client or self._locks._client, gate, args)

    async def release(self) -> bool:
        """Stops renewing (waiting for a renewal in flight), then releases."""
        if self._released:
            return False
        self._stopping = True
        self._keeper.cancel()
        # Waits for it to end without taking on its outcome: a cancel that
        # comes meanwhile is the caller's, and propagates.
        await asyncio.wait({self._keeper})
        reply = await self._locks._call(*self._keys.release(self.token))
        # Only now: a release cut short (cancelled) may be called again.
        self._released = True
        return int(reply or 0) >= 1

    async def __aenter__(self) -> "Lease":
        return self

    async def __aexit__(self, kind: Any, error: Any, trace: Any) -> None:
        lost = not self.is_valid()
        try:
            await asyncio.shield(self.release())
        except RedisError:
            pass
        if lost and kind is None:
            raise LockLost(f"the lock on {self.key} was lost while the work ran "
                           "(it may have overlapped another holder)")


class Locks:
    """Locks over your own ``redis.asyncio.Redis`` (see
    :class:`redis_lock_client.Locks`)."""

    def __init__(self, client: Any, *, renew: bool = True) -> None:
        self._client = client
        self._renew = renew
        self._cluster = hasattr(client, "get_node_from_key")
        self._server = c.server_name(client)
        # Each node's client for blocking waits, and the loop it was made in.
        self._waits: Dict[Any, Tuple[Any, Any]] = {}
        # The releases due later of cancelled acquisitions: task -> what
        # it releases (ended by aclose, which releases each once more).
        self._undoing: Dict[Any, Tuple[c.Keys, str]] = {}

    async def acquire(self, key: str, ttl: float = 30, timeout: float = 0, *,
                      shared: bool = False, limit: Optional[int] = None,
                      token: Optional[str] = None) -> Optional[Lease]:
        """A :class:`Lease`, or None when not granted within ``timeout``."""
        return await self._acquire(c.Keys.of([key], shared, limit), ttl, timeout, token)

    async def acquire_all(self, keys: Sequence[str], ttl: float = 30, timeout: float = 0, *,
                          shared: bool = False, limit: Optional[int] = None,
                          token: Optional[str] = None) -> Optional[Lease]:
        return await self._acquire(c.Keys.of(keys, shared, limit), ttl, timeout, token)

    @asynccontextmanager
    async def lock(self, key: str, ttl: float = 30, *, timeout: Optional[float] = None,
                   shared: bool = False, limit: Optional[int] = None) -> AsyncIterator[Lease]:
        """``async with locks.lock("k", ttl=30) as lease:``."""
        async with self._held(c.Keys.of([key], shared, limit), ttl, timeout) as lease:
            yield lease

    @asynccontextmanager
    async def lock_all(self, keys: Sequence[str], ttl: float = 30, *,
                       timeout: Optional[float] = None, shared: bool = False,
                       limit: Optional[int] = None) -> AsyncIterator[Lease]:
        async with self._held(c.Keys.of(keys, shared, limit), ttl, timeout) as lease:
            yield lease

    def synchronized(self, key: str, ttl: float = 30, *, timeout: Optional[float] = None,
                     shared: bool = False, limit: Optional[int] = None) -> Callable[[F], F]:
        """A decorator for coroutine functions: each call runs under the lock."""

        def decorate(f: F) -> F:
            if not inspect.iscoroutinefunction(f):
                raise TypeError("not a coroutine function: use redis_lock_client.Locks")

            @functools.wraps(f)
            async def wrapper(*args: Any, **kwargs: Any) -> Any:
                async with self.lock(key, ttl, timeout=timeout, shared=shared, limit=limit):
                    return await f(*args, **kwargs)

            return wrapper  # type: ignore[return-value]

        return decorate

    def campaign(self, key: str, value: c.Value, ttl: float = 30, *,
                 timeout: Optional[float] = None) -> "_Campaign":
        """Stands for leader of ``key`` with the public ``value`` (see
        :meth:`redis_lock_client.Locks.campaign`): ``lease = await
        locks.campaign(...)``, or ``async with locks.campaign(...) as
        lease:`` (resigns on exit). :class:`NotAcquired` when not granted
        within ``timeout`` (None: waits for ever)."""
        c.check_value(value)
        keys = c.Keys.of([key], False, None)
        return _Campaign(self, keys, value, ttl, timeout)

    async def leader(self, key: str) -> Optional[Leader]:
        """Who leads ``key`` now: a :class:`Leader`, or None when vacant."""
        c.Keys.of([key], False, None)
        return c.leader_of(await self._call(*c.observe_args(key)))

    def observe(self, key: str, *, check_interval: float = c.OBSERVE_WAIT_S) -> "Observer":
        """``async for leader in locks.observe(key):`` the leaders of
        ``key`` as they change (None: vacant), the state now first. One
        connection of its own: ``await observer.aclose()``, or ``async
        with``. ``check_interval``: as the sync client's (a connection
        silent for it and 5 s more is replaced)."""
        c.Keys.of([key], False, None)
        return Observer(self, key, c.to_ms(check_interval, "check_interval"))

    @asynccontextmanager
    async def _held(self, keys: c.Keys, ttl: float,
                    timeout: Optional[float]) -> AsyncIterator[Lease]:
        lease = await self._acquire(keys, ttl, timeout, None)
        if lease is None:
            raise NotAcquired(f"{keys.first} was not granted within {timeout} s")
        async with lease:
            yield lease

    async def _acquire(self, keys: c.Keys, ttl: float, timeout: Optional[float],
                       token: Optional[str], value: Optional[c.Value] = None) -> Optional[Lease]:
        ttl_ms = c.to_ms(ttl, "ttl")
        own = token is None
        token = token or c.random_token()
        started = time.monotonic()
        lease: Optional[Lease] = None
        try:
            if timeout is not None and timeout <= 0:
                fence = await self._call(*keys.acquire(token, ttl_ms, value=value))
            else:
                block_ms = 0 if timeout is None else max(1, c.to_ms(timeout, "timeout"))
                fence = await self._wait(keys, keys.acquire(token, ttl_ms, block_ms, value))
            if fence is None:
                return None
            if own and time.monotonic() - started >= ttl / 2:
                started = time.monotonic()
                fence = await self._call(*keys.acquire(token, ttl_ms, value=value)) or fence
            lease = Lease(self, keys, token, int(fence), ttl, started, self._renew, value)
            return lease
        except BaseException:
            # Cancelled, or failed with the request perhaps granted: the
            # wait's connection is closed (the server drops its place in
            # line, or takes back a grant it could not deliver), and a
            # token of ours is released.
            if lease is not None:
                lease._stopping = True
                lease._keeper.cancel()
            if own:
                await asyncio.shield(self._undo(keys, token))
            raise

    async def _undo(self, keys: c.Keys, token: str) -> None:
        """Releases a token of ours that nothing holds for the caller: now,
        and again a little later (see :meth:`redis_lock_client.Locks._undo`)."""
        await self._release_quietly(keys, token)
        await asyncio.sleep(c.UNDO_SETTLE_S)
        await self._release_quietly(keys, token)

        async def later() -> None:
            for delay in c.UNDO_AGAIN_S:
                await asyncio.sleep(delay)
                await self._release_quietly(keys, token)

        task = asyncio.get_running_loop().create_task(later())
        self._undoing[task] = (keys, token)
        task.add_done_callback(lambda t: self._undoing.pop(t, None))

    async def _release_quietly(self, keys: c.Keys, token: str) -> None:
        try:
            await self._call(*keys.release(token))
        except Exception:  # noqa: BLE001 - best effort
            # Not a cancel: aclose ends a release due later with one, and
            # one swallowed here would let its next release run on.
            pass

    async def _call(self, *args: Any) -> Any:
        try:
            return await self._client.execute_command(*args)
        except RedisError as e:
            raise c.translate(e, self._server) from None

    def _wait_client(self, key: str) -> Any:
        if self._cluster:
            node = self._client.get_node_from_key(key)
            ident: Any = (node.host, node.port)
            # The node's own connection settings, as it makes its
            # connections (the cluster client's also hold its response
            # callbacks, which a connection does not take).
            kwargs = dict(node.connection_kwargs)
            kwargs.update(host=node.host, port=node.port)
            connection_class = node.connection_class
        else:
            ident = None
            pool = self._client.connection_pool
            kwargs = dict(pool.connection_kwargs)
            connection_class = pool.connection_class
        # A connection belongs to the event loop it was made in: the same
        # Locks used from another loop (a second asyncio.run, a test
        # framework's loop per test) gets wait connections of its own; the
        # earlier loop's are dropped unclosed (closing needs that loop).
        loop = asyncio.get_running_loop()
        made = self._waits.get(ident)
        if made is not None and made[0] is loop:
            return made[1]
        kwargs = c.wait_kwargs(kwargs)
        kwargs["retry"] = Retry(NoBackoff(), 0)
        pool = aredis.ConnectionPool(connection_class=connection_class, **kwargs)
        waits = aredis.Redis(connection_pool=pool)
        self._waits[ident] = (loop, waits)
        return waits

    async def _wait(self, keys: c.Keys, args: list) -> Any:
        try:
            return await self._wait_client(keys.first).execute_command(*args)
        except RedisError as e:
            raise c.translate(e, self._server) from None

    async def _send_once(self, client: Any, key: str, args: list) -> Any:
        if hasattr(client, "get_node_from_key"):
            node = client.get_node_from_key(key)
            try:
                return await node.execute_command(*args)
            except RedisError as e:
                raise c.translate(e, self._server) from None
        pool = client.connection_pool
        try:
            conn = await pool.get_connection()
        except TypeError:
            conn = await pool.get_connection(args[0])
        try:
            await conn.send_command(*args)
            return await conn.read_response()
        except RedisError as e:
            raise c.translate(e, self._server) from None
        finally:
            await pool.release(conn)

    async def aclose(self) -> None:
        """Closes the pools of blocking waits (the user's client is theirs),
        and ends the releases a cancelled acquisition left due later, each
        released once more now: nothing of these Locks runs after it (a
        release due later would reopen a connection on a client the caller
        closes next)."""
        loop = asyncio.get_running_loop()
        undoing, self._undoing = self._undoing, {}
        for task in undoing:
            # One of an earlier loop ended with it (cancelling it would
            # schedule on that closed loop): it is released below too.
            if task.get_loop() is loop:
                task.cancel()
        for keys, token in undoing.values():
            await self._release_quietly(keys, token)
        waits, self._waits = self._waits, {}
        for made_in, w in waits.values():
            if made_in is loop:
                await w.aclose() if hasattr(w, "aclose") else await w.close()


class _Campaign:
    """``locks.campaign(...)``: awaited, the leadership's :class:`Lease`;
    as ``async with``, the lease, resigned on exit."""

    def __init__(self, locks: Locks, keys: c.Keys, value: c.Value, ttl: float,
                 timeout: Optional[float]) -> None:
        self._locks = locks
        self._keys = keys
        self._value = value
        self._ttl = ttl
        self._timeout = timeout
        self._lease: Optional[Lease] = None

    async def _run(self) -> Lease:
        lease = await self._locks._acquire(self._keys, self._ttl, self._timeout, None, self._value)
        if lease is None:
            raise NotAcquired(f"{self._keys.first} was not granted within {self._timeout} s")
        return lease

    def __await__(self) -> Generator[Any, None, Lease]:
        return self._run().__await__()

    async def __aenter__(self) -> Lease:
        self._lease = await self._run()
        return self._lease

    async def __aexit__(self, kind: Any, error: Any, trace: Any) -> None:
        assert self._lease is not None
        await self._lease.__aexit__(kind, error, trace)


_UNSEEN: Any = object()  # nothing emitted yet
_NOTHING: Any = object()  # no change to emit


class Observer:
    """``async for leader in locks.observe(key):`` the leaders of ``key``
    as they change (see :class:`redis_lock_client.Observer`): a
    :class:`Leader`, or None for a vacancy; the state now first, then one
    item per change. One connection of its own, closed by ``aclose()``
    (also from another task while one waits in it), by ``async with``, or
    when a task waiting in it is cancelled (the next item then reconnects
    and resumes). Lost connections are retried with a short backoff and
    resume without a repeat or a miss."""

    def __init__(self, locks: Locks, key: str, wait_ms: int = p.OBSERVE_WAIT_MS) -> None:
        self._locks = locks
        self.key = key
        self._wait_ms = wait_ms
        self._conn: Any = None
        self._pending = False
        self._last: Any = _UNSEEN
        # Whether the wait names the value last given (see _step).
        self._exact = True
        self._closed = False

    def __repr__(self) -> str:
        return f"Observer(key={self.key!r}, closed={self._closed})"

    def __aiter__(self) -> "Observer":
        return self

    async def __anext__(self) -> Optional[Leader]:
        backoff = c.OBSERVE_BACKOFF_S[0]
        while True:
            if self._closed:
                raise StopAsyncIteration
            try:
                state = await self._step()
            except asyncio.CancelledError:
                # The read was cut short: redis-py closed the connection
                # (the server drops the blocked observe). Resumed next time.
                await self._drop()
                raise
            except Exception as e:  # noqa: BLE001
                if self._closed:
                    raise StopAsyncIteration from None
                if not c.passing(e):
                    await self.aclose()
                    if isinstance(e, RedisError):
                        raise c.translate(e, self._locks._server) from None
                    raise
                await self._drop()
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, c.OBSERVE_BACKOFF_S[1])
                continue
            if self._closed:
                # Closed while the round ran: nothing more is told.
                raise StopAsyncIteration
            if state is not _NOTHING:
                self._last = state
                self._exact = True
                return state

    def _connection(self) -> Any:
        if self._conn is None:
            pool = self._locks._wait_client(self.key).connection_pool
            self._conn = pool.connection_class(**pool.connection_kwargs)
        return self._conn

    async def _step(self) -> Any:
        conn = self._connection()
        try:
            return await self._round(conn)
        finally:
            if conn is not self._conn:
                # Dropped under this round (aclose from another task): a
                # connect still under way then, or a send that reconnected,
                # left it open, and nothing else holds it now.
                await _disconnect(conn)

    async def _round(self, conn: Any) -> Any:
        if not self._pending:
            if self._last is _UNSEEN:
                await conn.send_command(*c.observe_args(self.key))
                return c.leader_of(await _read_within(conn, c.OBSERVE_GRACE_S))
            # The state now and a wait for the next change in one write
            # (see redis_lock_client.Observer).
            wait = c.observe_args(self.key, self._last, wait_ms=self._wait_ms, with_value=self._exact)
            await conn.send_packed_command(conn.pack_commands([c.observe_args(self.key), wait]))
            self._pending = True
            now = c.leader_of(await _read_within(conn, c.OBSERVE_GRACE_S))
            if now != self._last:
                return now
        # Bounded here too: the server answers nil when the wait ends.
        reply = await _read_within(conn, self._wait_ms / 1000 + c.OBSERVE_GRACE_S)
        self._pending = False
        if reply is None:
            return _NOTHING
        now = c.leader_of(reply)
        if now == self._last:
            # Answered though nothing changed: the value as decoded is not
            # the bytes the server holds (decode_responses with a value that
            # is not UTF-8), so naming it never matches. Wait on the fence
            # alone for this leader rather than be answered at once for ever.
            self._exact = False
            return _NOTHING
        return now

    async def _drop(self) -> None:
        conn, self._conn = self._conn, None
        self._pending = False
        if conn is not None:
            await _disconnect(conn)

    async def aclose(self) -> None:
        """Closes its connection (the server drops the blocked observe);
        the iteration ends."""
        self._closed = True
        await self._drop()

    close = aclose

    async def __aenter__(self) -> "Observer":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()


async def _disconnect(conn: Any) -> None:
    try:
        await conn.disconnect(nowait=True)
    except Exception:  # noqa: BLE001 - gone already
        pass


async def _read_within(conn: Any, seconds: float) -> Any:
    """The next reply on ``conn``, or :class:`Silent` when none came within
    ``seconds`` (the read cut short: the connection is dropped). Not the
    read's own ``timeout``: redis-py answers None then, which a wait's nil
    cannot be told from."""
    try:
        return await asyncio.wait_for(conn.read_response(), seconds)
    except asyncio.TimeoutError:
        raise c.Silent(seconds) from None
