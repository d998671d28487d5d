import { Arg } from './client.js';
/** Who leads a key: the fencing token of its holder's grant, and the
 * public value it campaigned with (`null`: none). A proclaim keeps the
 * fence and changes the value. */
export interface Leader {
    readonly fence: number;
    readonly value: string | null;
}
/** `LOCK.OBSERVE key` (the state now), or given what was `seen`, `AFTER
 * fence VALUE v BLOCK waitMs`: wait until the key is no longer led by it
 * with its value (`null`: until it is no longer vacant, `AFTER 0`), nil
 * after `waitMs`. Without `withValue`, the wait names the fence alone (the
 * holder's value now). */
export declare const observeArgs: (key: string, seen?: Leader | null, withValue?: boolean, waitMs?: number) => Arg[];
/** `LOCK.OBSERVE`'s reply (a flat array on RESP2, a map or an object on
 * RESP3) as a `Leader`, or null when nobody holds the key (fence 0). */
export declare function leaderOf(reply: unknown): Leader | null;
/** Same leader, same value (or both vacant). */
export declare const sameLeader: (a: Leader | null, b: Leader | null) => boolean;
export declare function checkValue(value: unknown): string;
/** Whole milliseconds of a duration given in ms: positive, finite, within
 * what the module accepts. */
export declare function checkMs(ms: number, what: string): number;
/** Redlock's allowance for clock drift, as the Rust client: 1% of the TTL
 * plus 2 ms. A lease is valid for its TTL less this and less the time its
 * request took. */
export declare const drift: (ttlMs: number) => number;
/** An unguessable holder token: 128 random bits as hex. */
export declare function randomToken(): string;
export declare class Keys {
    readonly names: string[];
    readonly shared: boolean;
    readonly limit?: number;
    constructor(names: string[], shared?: boolean, limit?: number);
    get first(): string;
    private mode;
    /** `LOCK.ACQUIRE` (one key) or `LOCK.ACQUIREALL` (several); `value`:
     * the holder's public value (`VALUE v`). */
    acquire(token: string, ttlMs: number, blockMs?: number, value?: string): Arg[];
    release(token: string): Arg[];
    /** One `LOCK.EXTEND` per key: the lock is held while every key is. */
    extends(token: string, ttlMs: number): Arg[][];
    /** `LOCK.EXTEND key token ttl VALUE v`: renews the leader's lease and
     * sets its public value (one key, exclusive). Never a grant: 1 if
     * `token` held the key, 0 otherwise (nothing changed). */
    proclaim(token: string, ttlMs: number, value: string): Arg[];
    /** `LOCK.EXEC key token FENCE fence command...`, checked on the first key
     * (every key of the lock has the same holder and fence). */
    exec(token: string, fence: number, command: Arg[]): Arg[];
}
/** `LOCK.FENCED gate fence [command...]`. */
export declare const fencedArgs: (gate: string, fence: number, command: Arg[]) => Arg[];
