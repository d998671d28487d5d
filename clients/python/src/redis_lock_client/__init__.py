"""Locks for the redis-lock Redis module, over your own redis-py client.

::

    import redis
    from redis_lock_client import Locks

    locks = Locks(redis.Redis())
    with locks.lock("order:42", ttl=30) as lease:   # waits in the server's line
        db.write(order, fence=lease.fence)           # the resource refuses stale fences

The asyncio client is :mod:`redis_lock_client.asyncio`, the same API awaited.
"""

from ._common import Leader
from ._sync import Lease, Locks, Observer
from .errors import LockError, LockLost, ModuleMissing, NotAcquired, NotHeld, StaleFence

__all__ = ["Locks", "Lease", "Leader", "Observer", "LockError", "LockLost", "ModuleMissing",
           "NotAcquired", "NotHeld", "StaleFence"]
__version__ = "0.1.0"
