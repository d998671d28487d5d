import { RedisLike } from './client.js';
import { Lease } from './lease.js';
/** How to take a lock. */
export interface AcquireOptions {
    /** Aborts a wait: no lock and no place in line is left behind. */
    signal?: AbortSignal;
    /** How long to wait in the server's line (ms): 0 (default for
     * `acquire`) one attempt; `Infinity` (default for `using`) for ever. */
    timeoutMs?: number;
    /** The reader's side of a read/write lock. */
    shared?: boolean;
    /** A counting semaphore of this many holders (shared). */
    limit?: number;
    /** Your own holder token (default: a random one). */
    token?: string;
    /** Renew in the background at a third of the TTL (default: the `Locks`'). */
    renew?: boolean;
}
/** A routine run under the lock: `signal` is aborted if the lock is lost. */
export type Routine<T> = (signal: AbortSignal, lease: Lease) => Promise<T>;
/** Locks over your own client: an ioredis `Redis` or `Cluster`, or a
 * node-redis client (`createClient`). It opens no connection of its own
 * except those blocking waits need: a wait in the server's line holds its
 * connection, so waits go over duplicates of your client, kept for the
 * next wait. */
export declare class Locks {
    private readonly client;
    private readonly renew;
    constructor(client: RedisLike, options?: {
        renew?: boolean;
    });
    /** Takes the lock on `key` for `ttlMs`: a `Lease`, or null if another
     * holder has it and `timeoutMs` passed. A wait stands in the server's FIFO
     * line and is handed the lock the moment it frees. */
    acquire(key: string, ttlMs: number, options?: AcquireOptions): Promise<Lease | null>;
    /** Every key, all or nothing, with one fence (`LOCK.ACQUIREALL`). */
    acquireAll(keys: string[], ttlMs: number, options?: AcquireOptions): Promise<Lease | null>;
    /** Runs `routine` under the lock (node-redlock's shape): waits for it
     * (for ever unless `timeoutMs`: then `NotAcquiredError`), renews it in
     * the background, releases it when the routine ends, and throws
     * `LockLostError` if it was lost meanwhile (the routine's `signal` was
     * aborted then). `key` may be several keys, taken all or nothing. */
    using<T>(key: string | string[], ttlMs: number, routine: Routine<T>): Promise<T>;
    using<T>(key: string | string[], ttlMs: number, options: AcquireOptions, routine: Routine<T>): Promise<T>;
    /** Closes the idle wait connections (your client is yours). */
    close(): Promise<void>;
    private call;
    private take;
    /** Releases a token of ours that nothing holds for the caller: now, and
     * again a little later. A wait's connection closed on abort may still
     * have been handed the lock before the server saw it close (a reply
     * sent is a grant the server will not take back): the later releases,
     * once the close is seen, undo that grant. */
    private undo;
    /** A BLOCK acquire on a wait connection; an abort closes it at once (the
     * server drops the place in line, or takes back a grant it could not
     * deliver). */
    private wait;
}
