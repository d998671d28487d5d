"""The blocking client: :class:`Locks` over a ``redis.Redis`` or
``redis.RedisCluster``, :class:`Lease` for a held lock."""

from __future__ import annotations

import collections
import functools
import heapq
import inspect
import os
import threading
import time
from contextlib import contextmanager
from typing import (Any, Callable, Deque, Dict, Iterator, Optional, Sequence, Tuple,
                    TypeVar)

import redis
from redis.backoff import NoBackoff
from redis.exceptions import RedisError
from redis.retry import Retry

from . import _common as c
from . import _protocol as p
from ._common import Leader
from .errors import LockLost, NotAcquired

F = TypeVar("F", bound=Callable[..., Any])


class _Keeper:
    """Renewal for every lease of the process: one daemon thread keeps the
    time, sets ``lost`` when a lease's validity runs out, and hands each
    renewal that falls due to a pool of worker threads.

    A renewal waits on its own server, for as long as the client's
    timeouts and retries allow (for ever with redis-py's default of no
    socket timeout, when a server stops answering). The keeper never waits
    for one: a lease whose renewal has not come back when its validity
    ends is lost on time. And a renewal that has waited ``GRACE_S`` in
    line for a worker gets a new one: renewals stuck on one server delay
    those of others by that much at most. Workers end after ``IDLE_S``
    idle, so a process renewing now and then runs one (a thread per lease
    cost a thread's start on every grant, in the critical path of a
    contended lock)."""

    #: A renewal that has waited this long for a worker gets a new one.
    GRACE_S = 0.05
    #: A worker with nothing to do for this long ends.
    IDLE_S = 10.0

    def __init__(self) -> None:
        self._reset()
        if hasattr(os, "register_at_fork"):
            # The child has none of the parent's threads, and a lock held
            # by one of them at the fork would stay held.
            os.register_at_fork(after_in_child=self._reset)

    def _reset(self) -> None:
        self._due: list = []
        self._seq = 0
        self._cond = threading.Condition()
        self._thread: Optional[threading.Thread] = None
        self._work = threading.Condition()
        self._jobs: Deque[Tuple[float, Callable[[], None]]] = collections.deque()
        self._workers = 0
        self._idle = 0  # workers not running a job (started, or waiting for one)

    # ---- the clock ----

    def schedule(self, lease: "Lease", at: float) -> None:
        """Looks at ``lease`` at ``at`` (``time.monotonic()``), instead of
        any time given before. Called with the lease's ``_lock`` held."""
        with self._cond:
            self._seq += 1
            lease._slot = self._seq
            heapq.heappush(self._due, (at, self._seq, lease))
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="redis-lock keeper",
                                                daemon=True)
                self._thread.start()
            self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                while True:
                    now = time.monotonic()
                    check = self._supervise(now)
                    if self._due and self._due[0][0] <= now:
                        break
                    at = min((t for t in (check, self._due[0][0] if self._due else None)
                              if t is not None), default=None)
                    self._cond.wait(None if at is None else at - now)
                _, seq, lease = heapq.heappop(self._due)
            if seq != lease._slot:
                continue  # rescheduled since
            try:
                lease._tick()
            except Exception:  # noqa: BLE001 - a lease's trouble is its own
                pass

    # ---- the workers ----

    def run(self, job: Callable[[], None]) -> None:
        """Runs ``job`` on a worker: an idle one, or the first one; if all
        are busy, the keeper starts another once it has waited GRACE_S."""
        with self._work:
            self._jobs.append((time.monotonic(), job))
            if self._idle:
                self._work.notify()
            elif not self._workers:
                self._start_worker()

    def _supervise(self, now: float) -> Optional[float]:
        """A new worker for each renewal that waited GRACE_S with none idle
        for it; when to look again (None: nothing waits)."""
        with self._work:
            waited = 0
            for queued, _ in self._jobs:
                if now - queued < self.GRACE_S:
                    break
                waited += 1
            for _ in range(waited - self._idle):
                self._start_worker()
            if not self._jobs:
                return None
            if waited < len(self._jobs):
                return self._jobs[waited][0] + self.GRACE_S
            return now + self.GRACE_S

    def _start_worker(self) -> None:  # under _work
        self._workers += 1
        self._idle += 1
        try:
            threading.Thread(target=self._worker, name="redis-lock renewal", daemon=True).start()
        except BaseException:
            self._workers -= 1
            self._idle -= 1
            raise

    def _worker(self) -> None:
        while True:
            with self._work:
                deadline = time.monotonic() + self.IDLE_S
                while not self._jobs:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        self._workers -= 1
                        self._idle -= 1
                        return
                    self._work.wait(left)
                _, job = self._jobs.popleft()
                self._idle -= 1
            try:
                job()
            except Exception:  # noqa: BLE001 - a lease's trouble is its own
                pass
            finally:
                with self._work:
                    self._idle += 1


_KEEPER = _Keeper()


class Lease:
    """A held lock: its fencing token, renewal, guarded writes and release.

    ``fence`` goes with every write to the protected resource, which keeps
    the highest it has seen and refuses lower ones. ``lost`` (a
    ``threading.Event``) is set when the lock is lost: a renewal refused,
    or the lease's validity (its TTL less the time the grant took and 1%
    + 2 ms for clock drift) ran out without one.
    """

    def __init__(self, locks: "Locks", keys: c.Keys, token: str, fence: int, ttl: float,
                 started: float, renew: bool, value: Optional[c.Value] = None) -> None:
        self._locks = locks
        self._keys = keys
        self.token: str = token
        self.fence: int = int(fence)
        self.ttl: float = ttl
        #: The public value this holder stands with (``campaign``, changed
        #: by ``proclaim``); None for a lock taken without one.
        self.value: Optional[c.Value] = value
        self.lost = threading.Event()
        self._lock = threading.Lock()
        self._valid_until = started + ttl - c.drift(ttl)
        self._since = started
        self._stop = threading.Event()
        self._released = False
        self._renew = renew
        # Held while a renewal is sent: a release waits for it.
        self._renewing = threading.Lock()
        self._in_flight = False  # a renewal is on a worker (under _lock)
        self._slot = 0  # the keeper's current schedule of this lease
        with self._lock:
            self._next_renew = started + ttl / 3
            _KEEPER.schedule(self, self._wake())

    def __repr__(self) -> str:  # no token: it is the holder's credential
        return f"Lease(keys={list(self._keys.names)!r}, fence={self.fence}, valid={self.is_valid()})"

    @property
    def key(self) -> str:
        """The locked key (the first, for a lock of several keys)."""
        return self._keys.first

    @property
    def keys(self) -> Sequence[str]:
        """Every key of the lock."""
        return self._keys.names

    @property
    def valid_until(self) -> float:
        """Until when (``time.monotonic()``) the lock is surely held."""
        with self._lock:
            return self._valid_until

    def is_valid(self) -> bool:
        """Held, and within its validity."""
        return not self.lost.is_set() and time.monotonic() < self.valid_until

    # ---- renewal ----

    def _wake(self) -> float:
        """When the keeper must look at this lease next (under ``_lock``):
        at its validity's end while a renewal is on its way."""
        if self._renew and not self._in_flight:
            return min(self._next_renew, self._valid_until)
        return self._valid_until

    def _tick(self) -> None:
        """The keeper's look at the lease when due: lost if its validity
        ran out (a renewal still on its way or not), else a renewal handed
        to a worker if one is due; then the next look."""
        with self._lock:
            if self._stop.is_set() or self.lost.is_set():
                return
            now = time.monotonic()
            if now >= self._valid_until:
                self._lose()
                return
            if self._renew and not self._in_flight and now >= self._next_renew:
                self._in_flight = True
                _KEEPER.run(self._renew_once)
            _KEEPER.schedule(self, self._wake())

    def _renew_once(self) -> None:
        """One renewal, on a worker thread."""
        ok = held = False
        ttl = self.ttl
        started = time.monotonic()
        try:
            with self._renewing:
                if self._stop.is_set():
                    return
                ttl = self.ttl
                started = time.monotonic()
                held = self._extend_now(ttl)
                ok = True
        except Exception:  # noqa: BLE001 - RedisError mostly; retried below
            pass
        finally:
            with self._lock:
                self._in_flight = False
                if not self._stop.is_set() and not self.lost.is_set():
                    self._renewed(ok, held, ttl, started)

    def _renewed(self, ok: bool, held: bool, ttl: float, started: float) -> None:
        """A renewal's outcome (under ``_lock``)."""
        if not ok:
            # Retried while the validity allows; it runs out otherwise.
            self._next_renew = time.monotonic() + min(ttl / 10, 0.1)
        elif not held:
            self._lose()
            return
        elif started >= self._since:  # else extend() or proclaim() came after it
            self._valid_until = started + ttl - c.drift(ttl)
            self._since = started
            self._next_renew = started + ttl / 3
        _KEEPER.schedule(self, self._wake())

    def _extend_now(self, ttl: float) -> bool:
        ms = c.to_ms(ttl, "ttl")
        replies = [self._locks._call(*args) for args in self._keys.extends(self.token, ms)]
        return all(r == 1 for r in replies)

    def _lose(self) -> None:
        self.lost.set()

    def extend(self, ttl: Optional[float] = None) -> bool:
        """Sets the lease to ``ttl`` (default: its TTL) from now; later
        renewals use it. False, and ``lost`` set, if the lock was lost."""
        if self.lost.is_set():
            return False
        ttl = self.ttl if ttl is None else ttl
        started = time.monotonic()
        if not self._extend_now(ttl):
            self._lose()
            return False
        with self._lock:
            self.ttl = ttl
            self._valid_until = started + ttl - c.drift(ttl)
            self._since = started
            self._next_renew = started + ttl / 3
            _KEEPER.schedule(self, self._wake())
        return True

    # ---- leadership ----

    def proclaim(self, value: c.Value) -> None:
        """Changes this leader's public value (``LOCK.EXTEND key token ttl
        VALUE v``): its fence stays, its lease starts again, and observers
        are told (same fence, new value). Returns once the server has it.
        It never grants: :class:`LockLost` if the lock is no longer held
        (the key is left as it is, free or another's); the server's error
        for a value above ``lock.max-value-len`` (the old value stays)."""
        c.check_value(value)
        if len(self._keys.names) != 1 or self._keys.shared:
            raise TypeError("only a leader (one key, exclusive) has a value to proclaim")
        if self._released or self.lost.is_set():
            raise LockLost(f"the lock on {self.key} is not held: nothing to proclaim")
        ttl = self.ttl
        started = time.monotonic()
        held = self._locks._call(*self._keys.proclaim(self.token, c.to_ms(ttl, "ttl"), value))
        if held != 1:
            self._lose()
            raise LockLost(f"the lock on {self.key} was lost before the proclaim")
        self.value = value
        with self._lock:
            self._valid_until = started + ttl - c.drift(ttl)
            self._since = started
            self._next_renew = started + ttl / 3
            _KEEPER.schedule(self, self._wake())

    # ---- guarded writes ----

    def exec(self, *command: Any) -> Any:
        """Runs ``command`` on the lock's node only while this grant holds
        the lock, checked and run in one step by the server (``LOCK.EXEC
        key token FENCE fence command...``): its reply, or :class:`NotHeld`
        (nothing ran). Sent once, never retried."""
        args = c.exec_args(self._keys, self.token, self.fence, command)
        return self._locks._send_once(self._locks._client, self._keys.first, args)

    def fenced(self, gate: str, *command: Any, client: Any = None) -> Any:
        """Runs ``command`` behind the fence gate ``gate`` (``LOCK.FENCED
        gate fence command...``): only if this grant's fence is at least the
        highest the gate has accepted, which it then records. Its reply, or
        :class:`StaleFence` (a later holder has written; nothing ran).
        ``client``: the data's node, if not the lock's. Without a command
        it only checks and records. Sent once, never retried."""
        args = c.fenced_args(gate, self.fence, command)
        return self._locks._send_once(client or self._locks._client, gate, args)

    # ---- release ----

    def release(self) -> bool:
        """Stops renewing (waiting for a renewal in flight), then releases.
        True if the lock was still held and is now free."""
        if self._released:
            return False
        self._stop.set()
        # Wait for a renewal in flight: none may reach the server after
        # the release.
        with self._renewing:
            pass
        reply = self._locks._call(*self._keys.release(self.token))
        # Only now: a release cut short (Ctrl-C) may be called again.
        self._released = True
        return int(reply or 0) >= 1

    def __enter__(self) -> "Lease":
        return self

    def __exit__(self, kind: Any, error: Any, trace: Any) -> None:
        lost = not self.is_valid()
        try:
            self.release()
        except RedisError:
            pass  # the work is done: the lease ends by itself
        if lost and kind is None:
            raise LockLost(f"the lock on {self.key} was lost while the work ran "
                           "(it may have overlapped another holder)")


class Locks:
    """Locks over your own redis-py client (``redis.Redis`` or
    ``redis.RedisCluster``). Opens no connection of its own except those
    blocking waits need: a wait in the server's line holds its connection,
    so waits go over a pool of their own with the client's settings and no
    socket timeout.

    ``renew``: renew held locks in the background at a third of their TTL.
    """

    def __init__(self, client: Any, *, renew: bool = True) -> None:
        self._client = client
        self._renew = renew
        self._cluster = hasattr(client, "get_node_from_key")
        self._server = c.server_name(client)
        self._waits: Dict[Any, Any] = {}
        self._waits_lock = threading.Lock()
        # The releases due later of interrupted acquisitions: timer -> what
        # it releases (ended by close, which releases each once more).
        self._undoing: Dict[threading.Timer, Tuple[c.Keys, str]] = {}

    # ---- acquiring ----

    def acquire(self, key: str, ttl: float = 30, timeout: float = 0, *, shared: bool = False,
                limit: Optional[int] = None, token: Optional[str] = None) -> Optional[Lease]:
        """Takes the lock on ``key`` for ``ttl`` seconds: a :class:`Lease`,
        or None if another holder has it and ``timeout`` seconds passed
        (0: one attempt). A wait stands in the server's FIFO line and is
        handed the lock the moment it frees. ``shared``: a reader's side of
        a read/write lock; ``limit``: a counting semaphore of that many
        holders (shared). ``token``: your own holder token (default: a
        random one)."""
        return self._acquire(c.Keys.of([key], shared, limit), ttl, timeout, token)

    def acquire_all(self, keys: Sequence[str], ttl: float = 30, timeout: float = 0, *,
                    shared: bool = False, limit: Optional[int] = None,
                    token: Optional[str] = None) -> Optional[Lease]:
        """Every key of ``keys``, all or nothing, with one fence (``LOCK.ACQUIREALL``)."""
        return self._acquire(c.Keys.of(keys, shared, limit), ttl, timeout, token)

    @contextmanager
    def lock(self, key: str, ttl: float = 30, *, timeout: Optional[float] = None,
             shared: bool = False, limit: Optional[int] = None) -> Iterator[Lease]:
        """``with locks.lock("k", ttl=30) as lease:`` waits in the server's
        line (for ever with ``timeout=None``, else :class:`NotAcquired`),
        renews in the background, releases on exit; :class:`LockLost` if
        the lock was lost while the block ran."""
        with self._held(c.Keys.of([key], shared, limit), ttl, timeout) as lease:
            yield lease

    @contextmanager
    def lock_all(self, keys: Sequence[str], ttl: float = 30, *, timeout: Optional[float] = None,
                 shared: bool = False, limit: Optional[int] = None) -> Iterator[Lease]:
        """:meth:`lock` over several keys, all or nothing, one fence."""
        with self._held(c.Keys.of(keys, shared, limit), ttl, timeout) as lease:
            yield lease

    def synchronized(self, key: str, ttl: float = 30, *, timeout: Optional[float] = None,
                     shared: bool = False, limit: Optional[int] = None) -> Callable[[F], F]:
        """A decorator: the function runs under the lock (as :meth:`lock`)."""

        def decorate(f: F) -> F:
            if inspect.iscoroutinefunction(f):
                raise TypeError("a coroutine function: use redis_lock_client.asyncio.Locks")

            @functools.wraps(f)
            def wrapper(*args: Any, **kwargs: Any) -> Any:
                with self.lock(key, ttl, timeout=timeout, shared=shared, limit=limit):
                    return f(*args, **kwargs)

            return wrapper  # type: ignore[return-value]

        return decorate

    # ---- leader election ----

    def campaign(self, key: str, value: c.Value, ttl: float = 30, *,
                 timeout: Optional[float] = None) -> Lease:
        """Stands for leader of ``key`` with the public ``value`` (an
        address, an id: anyone reads it with :meth:`leader` and
        :meth:`observe`): waits in the server's line (for ever with
        ``timeout=None``, else :class:`NotAcquired` after ``timeout``
        seconds; 0: one attempt) and returns the leadership as a
        :class:`Lease` renewed in the background (renewals keep the
        value). ``lease.proclaim(v)`` changes the value, ``lease.release()``
        resigns: the next candidate in line leads at once. ``with
        locks.campaign(...) as lease:`` resigns on exit."""
        c.check_value(value)
        keys = c.Keys.of([key], False, None)
        lease = self._acquire(keys, ttl, timeout, None, value)
        if lease is None:
            raise NotAcquired(f"{key} was not granted within {timeout} s")
        return lease

    def leader(self, key: str) -> Optional[Leader]:
        """Who leads ``key`` now: a :class:`Leader` (its fence and value),
        or None when nobody holds it (``LOCK.OBSERVE key``)."""
        c.Keys.of([key], False, None)
        return c.leader_of(self._call(*c.observe_args(key)))

    def observe(self, key: str, *, check_interval: float = c.OBSERVE_WAIT_S) -> "Observer":
        """The leaders of ``key`` as they change: an iterator of
        :class:`Leader` (None: vacant), the state now first, then one item
        per change (a new leader, a vacancy, a proclaim). It holds one
        connection of its own; ``close()`` it (or use ``with``). A lost
        connection is opened again and the stream resumes where it was,
        without a repeat or a miss. Each wait lasts ``check_interval``
        seconds in the server (then it is sent again); a connection that
        answers nothing for that and 5 s more counts as lost, so one that
        went quiet without closing is replaced, whatever the client's
        ``socket_timeout``."""
        c.Keys.of([key], False, None)
        return Observer(self, key, c.to_ms(check_interval, "check_interval"))

    @contextmanager
    def _held(self, keys: c.Keys, ttl: float, timeout: Optional[float]) -> Iterator[Lease]:
        wait = None if timeout is None else timeout
        lease = self._acquire(keys, ttl, wait, None)
        if lease is None:
            raise NotAcquired(f"{keys.first} was not granted within {timeout} s")
        with lease:
            yield lease

    def _acquire(self, keys: c.Keys, ttl: float, timeout: Optional[float],
                 token: Optional[str], value: Optional[c.Value] = None) -> Optional[Lease]:
        ttl_ms = c.to_ms(ttl, "ttl")
        own = token is None
        token = token or c.random_token()
        started = time.monotonic()
        lease: Optional[Lease] = None
        try:
            if timeout is not None and timeout <= 0:
                fence = self._call(*keys.acquire(token, ttl_ms, value=value))
            else:
                # BLOCK 0 waits for ever; a wait of under a ms waits one.
                block_ms = 0 if timeout is None else max(1, c.to_ms(timeout, "timeout"))
                fence = self._wait(keys, keys.acquire(token, ttl_ms, block_ms, value))
            if fence is None:
                return None
            if own and time.monotonic() - started >= ttl / 2:
                # The wait used up half the lease: renew now for a validity
                # measured from here.
                started = time.monotonic()
                fence = self._call(*keys.acquire(token, ttl_ms, value=value)) or fence
            lease = Lease(self, keys, token, int(fence), ttl, started, self._renew, value)
            return lease
        except BaseException:
            # Interrupted (Ctrl-C can strike anywhere, the lease's own
            # start included) or failed with the request perhaps granted:
            # a token of ours holds nothing the caller will ever see.
            if lease is not None:
                lease._stop.set()
            if own:
                self._undo(keys, token)
            raise

    def _undo(self, keys: c.Keys, token: str) -> None:
        """Releases a token of ours that nothing holds for the caller: now,
        and again a little later. A wait whose connection closed may still
        have been handed the lock before the server saw it close (a reply
        sent is a grant the server will not take back); the later releases,
        once the close is seen, undo that grant."""
        self._release_quietly(keys, token)
        # Once more after a moment, on this thread: by then the server has
        # seen the wait's connection close (a program that ends on Ctrl-C
        # runs no timer).
        time.sleep(c.UNDO_SETTLE_S)
        self._release_quietly(keys, token)
        for delay in c.UNDO_AGAIN_S:
            t = threading.Timer(delay, self._release_later, (keys, token))
            t.daemon = True
            with self._waits_lock:
                self._undoing[t] = (keys, token)
            t.start()

    def _release_later(self, keys: c.Keys, token: str) -> None:
        """A release due later (a timer of :meth:`_undo`), unless close()
        ended it."""
        with self._waits_lock:
            due = self._undoing.pop(threading.current_thread(), None) is not None
        if due:
            self._release_quietly(keys, token)

    def _release_quietly(self, keys: c.Keys, token: str) -> None:
        try:
            self._call(*keys.release(token))
        except BaseException:  # noqa: BLE001 - best effort, the lease ends anyway
            pass

    # ---- talking to the server ----

    def _call(self, *args: Any) -> Any:
        try:
            return self._client.execute_command(*args)
        except RedisError as e:
            raise c.translate(e, self._server) from None

    def _wait_client(self, key: str) -> Any:
        """A client for blocking waits on ``key``'s node: its own pool, the
        user's settings, no socket timeout, no retries."""
        if self._cluster:
            node = self._client.get_node_from_key(key)
            ident: Any = (node.host, node.port)
            kwargs = dict(self._client.nodes_manager.connection_kwargs)
            kwargs.update(host=node.host, port=node.port)
            connection_class = kwargs.pop("connection_class", redis.Connection)
        else:
            ident = None
            pool = self._client.connection_pool
            kwargs = dict(pool.connection_kwargs)
            connection_class = pool.connection_class
        with self._waits_lock:
            waits = self._waits.get(ident)
            if waits is None:
                kwargs = c.wait_kwargs(kwargs)
                kwargs["retry"] = Retry(NoBackoff(), 0)
                pool = redis.ConnectionPool(connection_class=connection_class, **kwargs)
                waits = redis.Redis(connection_pool=pool)
                self._waits[ident] = waits
            return waits

    def _wait(self, keys: c.Keys, args: list) -> Any:
        try:
            return self._wait_client(keys.first).execute_command(*args)
        except RedisError as e:
            raise c.translate(e, self._server) from None

    def _send_once(self, client: Any, key: str, args: list) -> Any:
        """One command on one connection, never retried (a guarded write
        must not run twice)."""
        if hasattr(client, "get_node_from_key"):
            client = client.get_node_from_key(key).redis_connection
        pool = client.connection_pool
        conn = _connection(pool, args[0])
        try:
            conn.send_command(*args)
            return conn.read_response()
        except RedisError as e:
            raise c.translate(e, self._server) from None
        finally:
            pool.release(conn)

    def close(self) -> None:
        """Closes the pools of blocking waits (the user's client is theirs),
        and ends the releases an interrupted acquisition left due later,
        each released once more now: nothing of these Locks runs after it (a
        release due later would reopen a connection on a client the caller
        closes next)."""
        with self._waits_lock:
            undoing, self._undoing = self._undoing, {}
        for t in undoing:
            t.cancel()
        for token, keys in {token: keys for keys, token in undoing.values()}.items():
            self._release_quietly(keys, token)
        with self._waits_lock:
            for w in self._waits.values():
                w.close()
            self._waits.clear()


def _connection(pool: Any, name: str) -> Any:
    """A connection of ``pool`` (redis-py 6 takes no command name; 5 needs one)."""
    try:
        return pool.get_connection()
    except TypeError:
        return pool.get_connection(name)


_UNSEEN: Any = object()  # nothing emitted yet
_NOTHING: Any = object()  # no change to emit


class Observer:
    """``for leader in locks.observe(key):`` the leaders of ``key`` as they
    change: a :class:`Leader` for a leader, None for a vacancy; the state
    now first, then one item per change.

    It holds one connection of its own (a blocked ``LOCK.OBSERVE`` holds
    its connection as ``BLPOP`` does), made with the settings of the
    blocking waits. ``close()`` (from any thread, also while another waits
    in it), a ``with`` block, or dropping it closes the connection, and the
    iteration ends. A lost connection (or a restart's ``LOADING``) is tried
    again with a short backoff, for ever until closed, and the stream
    resumes where it was: the state read after reconnecting is emitted only
    if it differs from the last item. Other server errors (``NOPERM``,
    ``WRONGTYPE``, :class:`ModuleMissing`) close it and are raised.
    """

    def __init__(self, locks: "Locks", key: str, wait_ms: int = p.OBSERVE_WAIT_MS) -> None:
        self._locks = locks
        self.key = key
        self._wait_ms = wait_ms
        self._conn: Any = None
        self._pending = False  # a blocked OBSERVE's reply is still to come
        self._last: Any = _UNSEEN
        # Whether the wait names the value last given (see _step).
        self._exact = True
        self._closed = threading.Event()
        self._guard = threading.Lock()

    def __repr__(self) -> str:
        return f"Observer(key={self.key!r}, closed={self._closed.is_set()})"

    def __iter__(self) -> "Observer":
        return self

    def __next__(self) -> Optional[Leader]:
        backoff = c.OBSERVE_BACKOFF_S[0]
        while True:
            if self._closed.is_set():
                raise StopIteration
            try:
                state = self._step()
            except BaseException as e:
                if self._closed.is_set():
                    raise StopIteration from None
                if not c.passing(e):
                    self.close()
                    if isinstance(e, RedisError):
                        raise c.translate(e, self._locks._server) from None
                    raise
                self._drop()
                self._closed.wait(backoff)
                backoff = min(backoff * 2, c.OBSERVE_BACKOFF_S[1])
                continue
            if self._closed.is_set():
                # Closed while the round ran: nothing more is told.
                raise StopIteration
            if state is not _NOTHING:
                self._last = state
                self._exact = True
                return state

    def _connection(self) -> Any:
        with self._guard:
            if self._closed.is_set():
                raise redis.ConnectionError("the observer is closed")
            if self._conn is None:
                # Its own connection, outside any pool: close() may come
                # from another thread while this one reads from it.
                pool = self._locks._wait_client(self.key).connection_pool
                self._conn = pool.connection_class(**pool.connection_kwargs)
            return self._conn

    def _step(self) -> Any:
        """One round: the next item, or _NOTHING."""
        conn = self._connection()
        try:
            return self._round(conn)
        finally:
            with self._guard:
                dropped = conn is not self._conn
            if dropped:
                # Closed under this round from another thread: a connect
                # still under way then, or a send that reconnected, left it
                # open, and nothing else holds it now.
                _disconnect(conn)

    def _round(self, conn: Any) -> Any:
        if not self._pending:
            if self._last is _UNSEEN:
                conn.send_command(*c.observe_args(self.key))
                return c.leader_of(_read_within(conn, c.OBSERVE_GRACE_S, self._closed))
            # The state now, and a wait for the next change, in one write;
            # the wait names the fence and the value last told, so a change
            # made since (a proclaim keeps the fence) is answered at once.
            wait = c.observe_args(self.key, self._last, wait_ms=self._wait_ms, with_value=self._exact)
            conn.send_packed_command(conn.pack_commands([c.observe_args(self.key), wait]))
            self._pending = True
            now = c.leader_of(_read_within(conn, c.OBSERVE_GRACE_S, self._closed))
            if now != self._last:
                return now  # the wait's reply is the change after it
        # Bounded here too: the server answers nil when the wait ends.
        reply = _read_within(conn, self._wait_ms / 1000 + c.OBSERVE_GRACE_S, self._closed)
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

    def _drop(self) -> None:
        with self._guard:
            conn, self._conn = self._conn, None
            self._pending = False
        if conn is not None:
            _disconnect(conn)

    def close(self) -> None:
        """Closes its connection (the server drops the blocked observe);
        the iteration ends, also in a thread waiting in it."""
        self._closed.set()
        self._drop()

    def __enter__(self) -> "Observer":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001
            pass


def _disconnect(conn: Any) -> None:
    try:
        conn.disconnect()
    except Exception:  # noqa: BLE001 - gone already
        pass


#: How often a wait looks whether its observer was closed meanwhile (s).
_CLOSE_CHECK_S = 0.25


def _read_within(conn: Any, seconds: float, closed: threading.Event) -> Any:
    """The next reply on ``conn``, or :class:`Silent` when none began
    within ``seconds``. Waits in slices, so a close from another thread
    ends it within one: redis-py's ``can_read`` on a connection closed
    meanwhile opens a new one and would wait on that for the whole bound."""
    deadline = time.monotonic() + seconds
    while True:
        if closed.is_set():
            conn.disconnect()  # a connection reopened by a can_read
            raise redis.ConnectionError("the observer is closed")
        left = deadline - time.monotonic()
        if left <= 0:
            raise c.Silent(seconds)
        if conn.can_read(timeout=min(left, _CLOSE_CHECK_S)):
            return conn.read_response()
