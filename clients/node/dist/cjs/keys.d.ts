import { Arg } from './client.js';
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
    /** `LOCK.ACQUIRE` (one key) or `LOCK.ACQUIREALL` (several). */
    acquire(token: string, ttlMs: number, blockMs?: number): Arg[];
    release(token: string): Arg[];
    /** One `LOCK.EXTEND` per key: the lock is held while every key is. */
    extends(token: string, ttlMs: number): Arg[][];
    /** `LOCK.EXEC key token FENCE fence command...`, checked on the first key
     * (every key of the lock has the same holder and fence). */
    exec(token: string, fence: number, command: Arg[]): Arg[];
}
/** `LOCK.FENCED gate fence [command...]`. */
export declare const fencedArgs: (gate: string, fence: number, command: Arg[]) => Arg[];
