"""What the sync and asyncio clients share: the commands they send, how
the server's errors read, and the lease's arithmetic. Nothing here talks to
a server."""

from __future__ import annotations

import math
import re
import secrets
from dataclasses import dataclass
from typing import Any, List, Optional, Sequence, Tuple, Union

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from . import _protocol as p
from .errors import ModuleMissing, NotHeld, StaleFence

#: Times are seconds (floats), as redis-py's ``Lock`` takes them.
Seconds = float

# Words of leader election not (yet) in the generated ``_protocol``
# (tests/client_protocol.rs lists the words it copies there).
OBSERVE = p.OBSERVE
AFTER = p.AFTER
VALUE = p.VALUE

#: A leader's public value: what ``campaign`` takes. Read back as the
#: client reads any string reply: ``bytes``, or ``str`` with
#: ``decode_responses=True``.
Value = Union[str, bytes]


@dataclass(frozen=True)
class Leader:
    """Who leads a key: the fencing token of its holder's grant and the
    public value it campaigned with (None: it gave none). Equal when both
    are: a proclaim keeps the fence and changes the value."""

    fence: int
    value: Optional[Value] = None


def check_value(value: Any) -> Value:
    if not isinstance(value, (str, bytes)):
        raise TypeError(f"a leader's value is a str or bytes, not {type(value).__name__}")
    return value


def observe_args(
    key: Any, seen: Optional["Leader"] = None, wait_ms: int = 0, with_value: bool = True
) -> List[Any]:
    """``LOCK.OBSERVE key`` (the state now), or with ``wait_ms``, ``AFTER
    fence VALUE v BLOCK wait_ms``: wait until the key is no longer led by
    ``seen`` with its value (``None``: until it is no longer vacant, ``AFTER
    0``), nil after ``wait_ms``; without ``with_value``, on the fence alone
    (the holder's value now)."""
    if not wait_ms:
        return [OBSERVE, key]
    if seen is None:
        return [OBSERVE, key, AFTER, 0, p.BLOCK, wait_ms]
    if not with_value:
        return [OBSERVE, key, AFTER, seen.fence, p.BLOCK, wait_ms]
    value = b"" if seen.value is None else seen.value
    return [OBSERVE, key, AFTER, seen.fence, p.VALUE, value, p.BLOCK, wait_ms]


def leader_of(reply: Any) -> Optional[Leader]:
    """``LOCK.OBSERVE``'s reply (a map on RESP3, a flat array on RESP2) as
    a :class:`Leader`, or None when nobody holds the key (fence 0)."""
    if isinstance(reply, dict):
        pairs = list(reply.items())
    elif isinstance(reply, (list, tuple)):
        pairs = list(zip(reply[0::2], reply[1::2]))
    else:
        raise TypeError(f"unexpected reply to {OBSERVE}: {reply!r}")
    fields = {(k.decode() if isinstance(k, bytes) else k): v for k, v in pairs}
    fence = int(fields["fence"])
    if fence == 0:
        return None
    return Leader(fence, fields.get("value"))


#: An observer that lost its connection tries again after these waits
#: (doubling from the first up to the last), for ever, until closed.
OBSERVE_BACKOFF_S = (0.05, 1.0)

#: How long each wait of an observer lasts in the server before it answers
#: nil and is sent again (``observe(check_interval=...)``'s default, s).
OBSERVE_WAIT_S = p.OBSERVE_WAIT_MS / 1000

#: How long past its wait (or, for the state now, at all) an observer waits
#: for an answer before its connection counts as gone and is replaced: a
#: connection that went quiet without closing (a host gone, a NAT that
#: forgot the flow) costs a follower at most the wait and this.
OBSERVE_GRACE_S = p.OBSERVE_GRACE_MS / 1000


class Silent(RedisConnectionError):
    """No answer came within an observer's bound of ``seconds``: its
    connection counts as gone (a lost connection, ridden out like one)."""

    def __init__(self, seconds: float) -> None:
        super().__init__(f"no answer within {seconds:g} s: the connection counts as lost")

#: Server errors that pass (a restart loading its data, a failover): an
#: observer retries them as it does a lost connection.
_PASSING = ("LOADING", "UNBLOCKED", "TRYAGAIN", "MASTERDOWN", "BUSY")


def passing(error: BaseException) -> bool:
    """A lost connection, a timeout, or a server error that passes: what an
    observer rides out (reconnecting, and resuming where it was)."""
    if isinstance(error, (RedisConnectionError, RedisTimeoutError, OSError)):
        return True
    return isinstance(error, ResponseError) and str(error).split(" ", 1)[0] in _PASSING


def random_token() -> str:
    """128 random bits as hex: unguessable, so only its holder releases."""
    return secrets.token_hex(16)


def to_ms(seconds: Seconds, what: str) -> int:
    """A positive duration in whole milliseconds (rounded up)."""
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)):
        raise TypeError(f"{what} must be a number of seconds, not {type(seconds).__name__}")
    if not seconds > 0 or math.isinf(seconds):
        raise ValueError(f"{what} must be a positive number of seconds, not {seconds!r}")
    ms = math.ceil(seconds * 1000)
    if ms > p.MAX_BLOCK_MS:
        raise ValueError(f"{what} is longer than the module accepts ({p.MAX_BLOCK_MS} ms)")
    return ms


#: A cancelled acquisition's token is released at once, again this long
#: after (on the same thread or task: the server has seen the wait's
#: connection close by then), and again in the background at these times.
UNDO_SETTLE_S = 0.01
UNDO_AGAIN_S = (0.25, 1.0)


def drift(ttl: Seconds) -> Seconds:
    """Redlock's allowance for clock drift, as the Rust client: 1% of the
    TTL plus 2 ms. A lease is valid for its TTL less this and less the time
    its request took."""
    return ttl * 0.01 + 0.002


@dataclass(frozen=True)
class Keys:
    """The keys of one lock (one, or several taken all or nothing) and its
    mode: exclusive, shared, or a counting semaphore of ``limit``."""

    names: Tuple[str, ...]
    shared: bool = False
    limit: Optional[int] = None

    @staticmethod
    def of(names: Sequence[str], shared: bool, limit: Optional[int]) -> "Keys":
        names = tuple(names)
        if not names:
            raise ValueError("a lock needs at least one key")
        for k in names:
            if not isinstance(k, (str, bytes)) or len(k) == 0:
                raise ValueError(f"a key must be a non-empty string, not {k!r}")
        if len(set(names)) != len(names):
            raise ValueError("a key is named twice")
        if limit is not None:
            if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
                raise ValueError(f"limit must be a positive integer, not {limit!r}")
            shared = True
        return Keys(names, shared, limit)

    @property
    def first(self) -> str:
        return self.names[0]

    def _mode(self) -> List[Any]:
        words: List[Any] = []
        if self.shared:
            words.append(p.SHARED)
        if self.limit is not None:
            words += [p.LIMIT, self.limit]
        return words

    def acquire(self, token: str, ttl_ms: int, block_ms: Optional[int] = None,
                value: Optional[Value] = None) -> List[Any]:
        """``LOCK.ACQUIRE`` (one key) or ``LOCK.ACQUIREALL`` (several);
        ``value``: the holder's public value (``VALUE v``)."""
        if len(self.names) == 1:
            args: List[Any] = [p.ACQUIRE, self.first, token, ttl_ms]
        else:
            args = [p.ACQUIRE_ALL, len(self.names), *self.names, token, ttl_ms]
        args += self._mode()
        if value is not None:
            args += [VALUE, value]
        if block_ms is not None:
            args += [p.BLOCK, block_ms]
        return args

    def release(self, token: str) -> List[Any]:
        if len(self.names) == 1:
            return [p.RELEASE, self.first, token]
        return [p.RELEASE_ALL, len(self.names), *self.names, token]

    def extends(self, token: str, ttl_ms: int) -> List[List[Any]]:
        """One ``LOCK.EXTEND`` per key: the lock is held while every key is."""
        return [[p.EXTEND, k, token, ttl_ms] for k in self.names]

    def proclaim(self, token: str, ttl_ms: int, value: Value) -> List[Any]:
        """``LOCK.EXTEND key token ttl VALUE v``: renews the leader's lease
        and sets its public value (one key, exclusive). Never a grant: 1 if
        ``token`` held the key, 0 otherwise (nothing changed)."""
        return [p.EXTEND, self.first, token, ttl_ms, VALUE, value]


def exec_args(keys: Keys, token: str, fence: int, command: Sequence[Any]) -> List[Any]:
    """``LOCK.EXEC key token FENCE fence command...`` (checked on the first
    key: every key of the lock has the same holder and fence)."""
    if not command:
        raise ValueError("exec needs a command")
    return [p.EXEC, keys.first, token, p.FENCE_WORD, fence, *command]


def fenced_args(gate: str, fence: int, command: Sequence[Any]) -> List[Any]:
    """``LOCK.FENCED gate fence [command...]`` (no command: check and record)."""
    return [p.FENCED, gate, fence, *command]


_STALE = re.compile(r"fence (\d+) is below the gate's mark (\d+)")


def translate(error: RedisError, server: str) -> Exception:
    """The server's refusals as this package's errors: ``NOTHELD`` is
    :class:`NotHeld`, ``STALEFENCE`` :class:`StaleFence`, an unknown
    command :class:`ModuleMissing`; anything else as it came."""
    if not isinstance(error, ResponseError):
        return error
    text = str(error)
    word = text.split(" ", 1)[0]
    if word == p.NOT_HELD:
        return NotHeld(text)
    if word == p.STALE_FENCE:
        m = _STALE.search(text)
        if m:
            return StaleFence(int(m.group(1)), int(m.group(2)), text)
    if "unknown command" in text and "LOCK." in text.upper():
        return ModuleMissing(server)
    return error


def server_name(client: Any) -> str:
    """``redis://host:port/db`` of a redis-py client, for messages."""
    pool = getattr(client, "connection_pool", None)
    kwargs = getattr(pool, "connection_kwargs", None) or {}
    if "path" in kwargs:
        return f"unix://{kwargs['path']}"
    if "host" in kwargs:
        scheme = "rediss" if "ssl_cert_reqs" in kwargs or "ssl_keyfile" in kwargs else "redis"
        return f"{scheme}://{kwargs['host']}:{kwargs.get('port', 6379)}/{kwargs.get('db', 0)}"
    nodes = getattr(client, "startup_nodes", None)
    if nodes:
        return "redis-cluster://" + ",".join(f"{n.host}:{n.port}" for n in nodes)
    return "the server"


def wait_kwargs(kwargs: dict) -> dict:
    """The connection settings for a blocking wait: the client's own, with
    no socket timeout (a wait in the server's line may outlast it: a read
    that timed out would leave the line) and no retry (a retried BLOCK
    would queue again at the back)."""
    out = dict(kwargs)
    out["socket_timeout"] = None
    out.pop("retry", None)
    out.pop("retry_on_timeout", None)
    out.pop("retry_on_error", None)
    return out


