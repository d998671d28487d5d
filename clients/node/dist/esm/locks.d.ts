import { RedisLike } from './client.js';
import { Leader } from './keys.js';
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
/** How to stand for leader (`campaign`). */
export interface CampaignOptions {
    /** The lease (ms), renewed in the background; default 30 000. */
    ttlMs?: number;
    /** How long to wait in the server's line (ms): `Infinity` (default) for
     * ever; 0 one attempt. Not granted in time: `NotAcquiredError`. */
    timeoutMs?: number;
    /** Aborts the wait: no lock and no place in line is left behind. */
    signal?: AbortSignal;
    /** Renew in the background at a third of the TTL (default: the `Locks`'). */
    renew?: boolean;
}
/** How to observe (`observe`). */
export interface ObserveOptions {
    /** Ends the stream: its connection is closed, and the loop throws the
     * abort's reason (as `events.on` does). */
    signal?: AbortSignal;
    /** How long each wait lasts in the server (ms; default 30 000) before it
     * is sent again. A connection that answers nothing for that and 5 s
     * more counts as lost and is replaced: one that went quiet without
     * closing (a host gone, a NAT that forgot the flow) is not waited on
     * for ever. */
    checkIntervalMs?: number;
}
/** `locks.observe(key)`: the leaders of a key as they change. */
export type Observer = AsyncGenerator<Leader | null, void, undefined>;
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
    /** The releases an aborted acquisition left due later, by timer: what
     * each releases (ended by `close`, which releases each once more). */
    private readonly undoing;
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
    /** Stands for leader of `key` with the public `value` (an address, an
     * id: anyone reads it with `leader` and `observe`): waits in the
     * server's line (for ever unless `timeoutMs`: then `NotAcquiredError`)
     * and resolves to the leadership, a `Lease` renewed in the background
     * (renewals keep the value). `lease.proclaim(v)` changes the value,
     * `lease.release()` resigns: the next candidate in line leads at once. */
    campaign(key: string, value: string, options?: CampaignOptions): Promise<Lease>;
    /** Who leads `key` now: its fence and value, or null when nobody holds it
     * (`LOCK.OBSERVE key`). */
    leader(key: string): Promise<Leader | null>;
    /** The leaders of `key` as they change: `for await (const leader of
     * locks.observe(key))` gives `{ fence, value }`, or null for a vacancy;
     * the state now first, then one item per change (a new leader, a
     * vacancy, a proclaim). It holds one connection of its own (a blocked
     * `LOCK.OBSERVE` holds its connection), closed when the loop ends
     * (`break`, `return`, a throw) or `signal` aborts. A lost connection is
     * opened again with a short backoff, and the stream resumes where it
     * was, without a repeat or a miss. Other server errors end it, thrown. */
    observe(key: string, options?: ObserveOptions): Observer;
    private observing;
    /** Closes the idle wait connections (your client is yours), and ends
     * the releases an aborted acquisition left due later, each released once
     * more now: nothing of these locks runs on your client after it. */
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
