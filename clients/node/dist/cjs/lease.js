"use strict";
Object.defineProperty(exports, "__esModule", { value: true });
exports.Lease = void 0;
// A held lock: its fencing token, renewal, guarded writes and release.
const client_js_1 = require("./client.js");
const errors_js_1 = require("./errors.js");
const keys_js_1 = require("./keys.js");
const now = () => performance.now();
/** A held lock. `fence` goes with every write to the protected resource,
 * which keeps the highest it has seen and refuses lower ones. `signal` is
 * aborted when the lock is lost: a renewal refused, or the lease's validity
 * (its TTL less the time the grant took and 1% + 2 ms for clock drift) ran
 * out without one. `await using lease = ...` releases it. */
class Lease {
    renew;
    /** The fencing token. */
    fence;
    /** This holder's token: the credential for release and extend. */
    token;
    /** The public value this holder stands with (`campaign`, changed by
     * `proclaim`); null for a lock taken without one. */
    get value() {
        return this.valueOf;
    }
    valueOf;
    lost = new AbortController();
    keysOf;
    client;
    ttlMs;
    until;
    timer;
    released = false;
    renewing;
    /** @internal */
    constructor(client, keys, token, fence, ttlMs, started, renew, value = null) {
        this.renew = renew;
        this.client = client;
        this.keysOf = keys;
        this.valueOf = value;
        this.token = token;
        this.fence = Number(fence);
        this.ttlMs = ttlMs;
        this.until = started + ttlMs - (0, keys_js_1.drift)(ttlMs);
        this.schedule(started + ttlMs / 3);
    }
    /** The locked key (the first, for a lock of several keys). */
    get key() {
        return this.keysOf.first;
    }
    /** Every key of the lock. */
    get keys() {
        return [...this.keysOf.names];
    }
    /** Aborted when the lock is lost. */
    get signal() {
        return this.lost.signal;
    }
    /** Until when (`performance.now()` ms) the lock is surely held. */
    get validUntil() {
        return this.until;
    }
    /** Held, and within its validity. */
    isValid() {
        return !this.lost.signal.aborted && now() < this.until;
    }
    lose(why) {
        if (this.timer)
            clearTimeout(this.timer);
        this.timer = undefined;
        if (!this.lost.signal.aborted)
            this.lost.abort(new Error(`the lock on ${this.key} was lost: ${why}`));
    }
    /** The next wake-up: a renewal (if renewing) or the validity's end. */
    schedule(renewAt) {
        if (this.released || this.lost.signal.aborted)
            return;
        const wake = this.renew ? Math.min(renewAt, this.until) : this.until;
        this.timer = setTimeout(() => void this.tick(renewAt), Math.max(0, wake - now()));
        // A lease does not keep the process alive by itself.
        this.timer.unref?.();
    }
    async tick(renewAt) {
        if (this.released)
            return;
        if (now() >= this.until)
            return this.lose('its validity ran out without a renewal');
        if (!this.renew || now() < renewAt)
            return this.schedule(renewAt);
        const started = now();
        let held;
        try {
            this.renewing = this.extendNow(this.ttlMs);
            held = (await this.renewing);
        }
        catch {
            // Retried while the validity allows; it runs out otherwise.
            return this.schedule(now() + Math.min(this.ttlMs / 10, 100));
        }
        if (this.released)
            return;
        if (!held)
            return this.lose('a renewal was refused');
        this.until = started + this.ttlMs - (0, keys_js_1.drift)(this.ttlMs);
        this.schedule(started + this.ttlMs / 3);
    }
    async extendNow(ttlMs) {
        let all = true;
        for (const args of this.keysOf.extends(this.token, Math.ceil(ttlMs))) {
            all = (await this.call(this.client, args)) === 1 && all;
        }
        return all;
    }
    async call(conn, args) {
        try {
            return await conn.send(args);
        }
        catch (e) {
            throw (0, errors_js_1.translate)(e, conn.name);
        }
    }
    /** Sets the lease to `ttlMs` (default: its TTL) from now; later renewals
     * use it. False, and `signal` aborted, if the lock was lost. */
    async extend(ttlMs = this.ttlMs) {
        if (this.lost.signal.aborted)
            return false;
        const started = now();
        if (!(await this.extendNow(ttlMs))) {
            this.lose('an extend was refused');
            return false;
        }
        this.ttlMs = ttlMs;
        this.until = started + ttlMs - (0, keys_js_1.drift)(ttlMs);
        if (this.timer)
            clearTimeout(this.timer);
        this.schedule(started + ttlMs / 3);
        return true;
    }
    /** Changes this leader's public value (`LOCK.EXTEND key token ttl VALUE
     * v`): its fence stays, its lease starts again, and observers are told
     * (same fence, new value). Resolves once the server has it. It never
     * grants: `LockLostError` if the lock is no longer held (the key is left
     * as it is, free or another's); the server's error for a value above
     * `lock.max-value-len` (the old value stays). */
    async proclaim(value) {
        (0, keys_js_1.checkValue)(value);
        if (this.keysOf.names.length !== 1 || this.keysOf.shared) {
            throw new TypeError('only a leader (one key, exclusive) has a value to proclaim');
        }
        if (this.released || this.lost.signal.aborted) {
            throw new errors_js_1.LockLostError(`the lock on ${this.key} is not held: nothing to proclaim`);
        }
        const ttlMs = this.ttlMs;
        const started = now();
        const held = await this.call(this.client, this.keysOf.proclaim(this.token, Math.ceil(ttlMs), value));
        if (Number(held) !== 1) {
            this.lose('it was lost before a proclaim');
            throw new errors_js_1.LockLostError(`the lock on ${this.key} was lost before the proclaim`);
        }
        this.valueOf = value;
        this.until = started + ttlMs - (0, keys_js_1.drift)(ttlMs);
        if (this.timer)
            clearTimeout(this.timer);
        this.schedule(started + ttlMs / 3);
    }
    /** Runs `command` on the lock's node only while this grant holds the
     * lock, checked and run in one step by the server (`LOCK.EXEC key token
     * FENCE fence command...`): its reply, or `NotHeldError` (nothing ran). */
    exec(command) {
        return this.call(this.client, this.keysOf.exec(this.token, this.fence, command));
    }
    /** Runs `command` behind the fence gate `gate` (`LOCK.FENCED gate fence
     * command...`): only if this grant's fence is at least the highest the
     * gate has accepted, which it then records. Its reply, or
     * `StaleFenceError` (a later holder has written; nothing ran). `client`:
     * the data's node, if not the lock's. No command: check and record. */
    fenced(gate, command = [], client) {
        const conn = client ? (0, client_js_1.wrap)(client) : this.client;
        return this.call(conn, (0, keys_js_1.fencedArgs)(gate, this.fence, command));
    }
    /** Stops renewing (waiting for a renewal in flight), then releases. True
     * if the lock was still held and is now free. */
    async release() {
        if (this.released)
            return false;
        this.released = true;
        if (this.timer)
            clearTimeout(this.timer);
        if (this.renewing)
            await this.renewing.catch(() => { });
        const reply = await this.call(this.client, this.keysOf.release(this.token));
        return Number(reply ?? 0) >= 1;
    }
    /** `await using lease = await locks.acquire(...)`: released at the end
     * of the block. */
    async [Symbol.asyncDispose]() {
        await this.release().catch(() => { });
    }
}
exports.Lease = Lease;
