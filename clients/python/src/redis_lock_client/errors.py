"""The errors of redis_lock_client: each a ``LockError``."""

from __future__ import annotations


class LockError(Exception):
    """Base class of every error this package raises about a lock."""


class NotAcquired(LockError):
    """``locks.lock(...)``'s ``timeout`` passed before the lock was granted."""


class NotHeld(LockError):
    """A guarded command (``lease.exec``) found that this grant no longer
    holds the lock (its lease ended, it was released, or another holder has
    it): nothing ran. The server's reason is the message."""


class StaleFence(LockError):
    """A gate write (``lease.fenced``) carried a fence below the gate's mark:
    a later holder has written, so this holder is stale. Nothing ran."""

    def __init__(self, fence: int, mark: int, message: str = "") -> None:
        super().__init__(
            message
            or f"stale fence {fence}: the gate has accepted {mark}, so a later holder has written; nothing ran"
        )
        self.fence = fence
        self.mark = mark


class LockLost(LockError):
    """The lock was lost while the work under it ran (a renewal was refused,
    or none succeeded within the lease's validity): the work may have
    overlapped another holder's."""


class ModuleMissing(LockError):
    """The server does not know the ``LOCK.*`` commands: the redis-lock
    module is not loaded there."""

    def __init__(self, server: str = "the server") -> None:
        super().__init__(
            f"{server} does not know the LOCK commands: load the redis-lock module there "
            "(redis-server --loadmodule /path/to/libredis_lock.so, or MODULE LOAD /path/to/libredis_lock.so)"
        )
        self.server = server
