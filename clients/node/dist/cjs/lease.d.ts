import { Arg, Client, RedisLike } from './client.js';
import { Keys } from './keys.js';
/** A held lock. `fence` goes with every write to the protected resource,
 * which keeps the highest it has seen and refuses lower ones. `signal` is
 * aborted when the lock is lost: a renewal refused, or the lease's validity
 * (its TTL less the time the grant took and 1% + 2 ms for clock drift) ran
 * out without one. `await using lease = ...` releases it. */
export declare class Lease {
    private readonly renew;
    /** The fencing token. */
    readonly fence: number;
    /** This holder's token: the credential for release and extend. */
    readonly token: string;
    /** The public value this holder stands with (`campaign`, changed by
     * `proclaim`); null for a lock taken without one. */
    get value(): string | null;
    private valueOf;
    private readonly lost;
    private readonly keysOf;
    private readonly client;
    private ttlMs;
    private until;
    private timer?;
    private released;
    private renewing?;
    /** @internal */
    constructor(client: Client, keys: Keys, token: string, fence: number, ttlMs: number, started: number, renew: boolean, value?: string | null);
    /** The locked key (the first, for a lock of several keys). */
    get key(): string;
    /** Every key of the lock. */
    get keys(): string[];
    /** Aborted when the lock is lost. */
    get signal(): AbortSignal;
    /** Until when (`performance.now()` ms) the lock is surely held. */
    get validUntil(): number;
    /** Held, and within its validity. */
    isValid(): boolean;
    private lose;
    /** The next wake-up: a renewal (if renewing) or the validity's end. */
    private schedule;
    private tick;
    private extendNow;
    private call;
    /** Sets the lease to `ttlMs` (default: its TTL) from now; later renewals
     * use it. False, and `signal` aborted, if the lock was lost. */
    extend(ttlMs?: number): Promise<boolean>;
    /** Changes this leader's public value (`LOCK.EXTEND key token ttl VALUE
     * v`): its fence stays, its lease starts again, and observers are told
     * (same fence, new value). Resolves once the server has it. It never
     * grants: `LockLostError` if the lock is no longer held (the key is left
     * as it is, free or another's); the server's error for a value above
     * `lock.max-value-len` (the old value stays). */
    proclaim(value: string): Promise<void>;
    /** Runs `command` on the lock's node only while this grant holds the
     * lock, checked and run in one step by the server (`LOCK.EXEC key token
     * FENCE fence command...`): its reply, or `NotHeldError` (nothing ran). */
    exec(command: Arg[]): Promise<unknown>;
    /** Runs `command` behind the fence gate `gate` (`LOCK.FENCED gate fence
     * command...`): only if this grant's fence is at least the highest the
     * gate has accepted, which it then records. Its reply, or
     * `StaleFenceError` (a later holder has written; nothing ran). `client`:
     * the data's node, if not the lock's. No command: check and record. */
    fenced(gate: string, command?: Arg[], client?: RedisLike): Promise<unknown>;
    /** Stops renewing (waiting for a renewal in flight), then releases. True
     * if the lock was still held and is now free. */
    release(): Promise<boolean>;
    /** `await using lease = await locks.acquire(...)`: released at the end
     * of the block. */
    [Symbol.asyncDispose](): Promise<void>;
}
