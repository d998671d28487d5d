import * as p from './protocol.js';
const { OBSERVE, AFTER, VALUE } = p;
/** `LOCK.OBSERVE key` (the state now), or given what was `seen`, `AFTER
 * fence VALUE v BLOCK waitMs`: wait until the key is no longer led by it
 * with its value (`null`: until it is no longer vacant, `AFTER 0`), nil
 * after `waitMs`. Without `withValue`, the wait names the fence alone (the
 * holder's value now). */
export const observeArgs = (key, seen, withValue = true, waitMs = p.OBSERVE_WAIT_MS) => {
    if (seen === undefined)
        return [OBSERVE, key];
    if (seen === null)
        return [OBSERVE, key, AFTER, 0, p.BLOCK, waitMs];
    const named = withValue ? [VALUE, seen.value ?? ''] : [];
    return [OBSERVE, key, AFTER, seen.fence, ...named, p.BLOCK, waitMs];
};
/** `LOCK.OBSERVE`'s reply (a flat array on RESP2, a map or an object on
 * RESP3) as a `Leader`, or null when nobody holds the key (fence 0). */
export function leaderOf(reply) {
    const fields = new Map();
    if (Array.isArray(reply)) {
        for (let i = 0; i + 1 < reply.length; i += 2)
            fields.set(String(reply[i]), reply[i + 1]);
    }
    else if (reply instanceof Map) {
        for (const [k, v] of reply)
            fields.set(String(k), v);
    }
    else if (reply && typeof reply === 'object') {
        for (const [k, v] of Object.entries(reply))
            fields.set(k, v);
    }
    const fence = Number(fields.get('fence'));
    if (!Number.isSafeInteger(fence))
        throw new TypeError(`unexpected reply to ${OBSERVE}: ${String(reply)}`);
    if (fence === 0)
        return null;
    const v = fields.get('value');
    return { fence, value: v === null || v === undefined ? null : String(v) };
}
/** Same leader, same value (or both vacant). */
export const sameLeader = (a, b) => a === null || b === null ? a === b : a.fence === b.fence && a.value === b.value;
export function checkValue(value) {
    if (typeof value !== 'string')
        throw new TypeError(`a leader's value is a string, not ${typeof value}`);
    return value;
}
/** Whole milliseconds of a duration given in ms: positive, finite, within
 * what the module accepts. */
export function checkMs(ms, what) {
    if (typeof ms !== 'number' || !Number.isFinite(ms) || !(ms > 0)) {
        throw new RangeError(`${what} must be a positive number of milliseconds, not ${String(ms)}`);
    }
    const whole = Math.ceil(ms);
    if (whole > p.MAX_BLOCK_MS)
        throw new RangeError(`${what} is longer than the module accepts (${p.MAX_BLOCK_MS} ms)`);
    return whole;
}
/** Redlock's allowance for clock drift, as the Rust client: 1% of the TTL
 * plus 2 ms. A lease is valid for its TTL less this and less the time its
 * request took. */
export const drift = (ttlMs) => ttlMs * 0.01 + 2;
/** An unguessable holder token: 128 random bits as hex. */
export function randomToken() {
    const bytes = new Uint8Array(16);
    globalThis.crypto.getRandomValues(bytes);
    return Array.from(bytes, (b) => b.toString(16).padStart(2, '0')).join('');
}
export class Keys {
    names;
    shared;
    limit;
    constructor(names, shared = false, limit) {
        if (!Array.isArray(names) || names.length === 0)
            throw new RangeError('a lock needs at least one key');
        for (const k of names) {
            if (typeof k !== 'string' || k.length === 0)
                throw new RangeError(`a key must be a non-empty string, not ${JSON.stringify(k)}`);
        }
        if (new Set(names).size !== names.length)
            throw new RangeError('a key is named twice');
        if (limit !== undefined) {
            if (!Number.isInteger(limit) || limit < 1)
                throw new RangeError(`limit must be a positive integer, not ${String(limit)}`);
            shared = true;
        }
        this.names = [...names];
        this.shared = shared;
        this.limit = limit;
    }
    get first() {
        return this.names[0];
    }
    mode() {
        const words = [];
        if (this.shared)
            words.push(p.SHARED);
        if (this.limit !== undefined)
            words.push(p.LIMIT, this.limit);
        return words;
    }
    /** `LOCK.ACQUIRE` (one key) or `LOCK.ACQUIREALL` (several); `value`:
     * the holder's public value (`VALUE v`). */
    acquire(token, ttlMs, blockMs, value) {
        const args = this.names.length === 1
            ? [p.ACQUIRE, this.first, token, ttlMs]
            : [p.ACQUIRE_ALL, this.names.length, ...this.names, token, ttlMs];
        args.push(...this.mode());
        if (value !== undefined)
            args.push(VALUE, value);
        if (blockMs !== undefined)
            args.push(p.BLOCK, blockMs);
        return args;
    }
    release(token) {
        return this.names.length === 1
            ? [p.RELEASE, this.first, token]
            : [p.RELEASE_ALL, this.names.length, ...this.names, token];
    }
    /** One `LOCK.EXTEND` per key: the lock is held while every key is. */
    extends(token, ttlMs) {
        return this.names.map((k) => [p.EXTEND, k, token, ttlMs]);
    }
    /** `LOCK.EXTEND key token ttl VALUE v`: renews the leader's lease and
     * sets its public value (one key, exclusive). Never a grant: 1 if
     * `token` held the key, 0 otherwise (nothing changed). */
    proclaim(token, ttlMs, value) {
        return [p.EXTEND, this.first, token, ttlMs, VALUE, value];
    }
    /** `LOCK.EXEC key token FENCE fence command...`, checked on the first key
     * (every key of the lock has the same holder and fence). */
    exec(token, fence, command) {
        if (!Array.isArray(command) || command.length === 0)
            throw new RangeError('exec needs a command');
        return [p.EXEC, this.first, token, p.FENCE_WORD, fence, ...command];
    }
}
/** `LOCK.FENCED gate fence [command...]`. */
export const fencedArgs = (gate, fence, command) => [p.FENCED, gate, fence, ...command];
