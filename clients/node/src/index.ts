/**
 * Locks for the redis-lock Redis module, over your own ioredis or node-redis
 * client: fencing tokens, a FIFO line in the server with hand-off, renewal,
 * guarded writes.
 *
 * ```ts
 * import Redis from 'ioredis';
 * import { Locks } from 'redis-lock-client';
 *
 * const locks = new Locks(new Redis());
 * await locks.using('order:42', 30_000, async (signal, lease) => {
 *   await db.write(order, { fence: lease.fence }); // the resource refuses stale fences
 * });
 * ```
 */
export { Locks } from './locks.js';
export type { AcquireOptions, CampaignOptions, ObserveOptions, Observer, Routine } from './locks.js';
export { Lease } from './lease.js';
export type { Leader } from './keys.js';
export type { Arg, RedisLike } from './client.js';
export {
  LockError,
  LockLostError,
  ModuleMissingError,
  NotAcquiredError,
  NotHeldError,
  StaleFenceError,
} from './errors.js';
