"use strict";
var __createBinding = (this && this.__createBinding) || (Object.create ? (function(o, m, k, k2) {
    if (k2 === undefined) k2 = k;
    var desc = Object.getOwnPropertyDescriptor(m, k);
    if (!desc || ("get" in desc ? !m.__esModule : desc.writable || desc.configurable)) {
      desc = { enumerable: true, get: function() { return m[k]; } };
    }
    Object.defineProperty(o, k2, desc);
}) : (function(o, m, k, k2) {
    if (k2 === undefined) k2 = k;
    o[k2] = m[k];
}));
var __setModuleDefault = (this && this.__setModuleDefault) || (Object.create ? (function(o, v) {
    Object.defineProperty(o, "default", { enumerable: true, value: v });
}) : function(o, v) {
    o["default"] = v;
});
var __importStar = (this && this.__importStar) || (function () {
    var ownKeys = function(o) {
        ownKeys = Object.getOwnPropertyNames || function (o) {
            var ar = [];
            for (var k in o) if (Object.prototype.hasOwnProperty.call(o, k)) ar[ar.length] = k;
            return ar;
        };
        return ownKeys(o);
    };
    return function (mod) {
        if (mod && mod.__esModule) return mod;
        var result = {};
        if (mod != null) for (var k = ownKeys(mod), i = 0; i < k.length; i++) if (k[i] !== "default") __createBinding(result, mod, k[i]);
        __setModuleDefault(result, mod);
        return result;
    };
})();
Object.defineProperty(exports, "__esModule", { value: true });
exports.Locks = void 0;
// Taking locks: `Locks` over the user's own client.
const client_js_1 = require("./client.js");
const errors_js_1 = require("./errors.js");
const keys_js_1 = require("./keys.js");
const lease_js_1 = require("./lease.js");
const p = __importStar(require("./protocol.js"));
/** An observer that lost its connection tries again after these waits
 * (doubling from the first up to the second, ms), for ever until stopped. */
const OBSERVE_BACKOFF_MS = [50, 1000];
const now = () => performance.now();
/** An aborted acquisition's token is released at once, again this long
 * after, and again in the background at these times (ms). */
const UNDO_SETTLE_MS = 10;
const UNDO_AGAIN_MS = [250, 1000];
/** Locks over your own client: an ioredis `Redis` or `Cluster`, or a
 * node-redis client (`createClient`). It opens no connection of its own
 * except those blocking waits need: a wait in the server's line holds its
 * connection, so waits go over duplicates of your client, kept for the
 * next wait. */
class Locks {
    client;
    renew;
    /** The releases an aborted acquisition left due later, by timer: what
     * each releases (ended by `close`, which releases each once more). */
    undoing = new Map();
    constructor(client, options = {}) {
        this.client = (0, client_js_1.wrap)(client);
        this.renew = options.renew ?? true;
    }
    /** Takes the lock on `key` for `ttlMs`: a `Lease`, or null if another
     * holder has it and `timeoutMs` passed. A wait stands in the server's FIFO
     * line and is handed the lock the moment it frees. */
    async acquire(key, ttlMs, options = {}) {
        return this.take(new keys_js_1.Keys([key], options.shared, options.limit), ttlMs, options);
    }
    /** Every key, all or nothing, with one fence (`LOCK.ACQUIREALL`). */
    async acquireAll(keys, ttlMs, options = {}) {
        return this.take(new keys_js_1.Keys(keys, options.shared, options.limit), ttlMs, options);
    }
    async using(key, ttlMs, a, b) {
        const [options, routine] = typeof a === 'function' ? [{}, a] : [a, b];
        const keys = new keys_js_1.Keys(Array.isArray(key) ? key : [key], options.shared, options.limit);
        const lease = await this.take(keys, ttlMs, { timeoutMs: Infinity, renew: true, ...options });
        if (!lease)
            throw new errors_js_1.NotAcquiredError(`${keys.first} was not granted within ${options.timeoutMs} ms`);
        let out;
        try {
            out = await routine(lease.signal, lease);
        }
        catch (e) {
            // The routine's own error goes first.
            await lease.release().catch(() => { });
            throw e;
        }
        // Judged before the release: was the lock held all along?
        const kept = lease.isValid();
        await lease.release().catch(() => { });
        if (!kept)
            throwLost(keys);
        return out;
    }
    /** Stands for leader of `key` with the public `value` (an address, an
     * id: anyone reads it with `leader` and `observe`): waits in the
     * server's line (for ever unless `timeoutMs`: then `NotAcquiredError`)
     * and resolves to the leadership, a `Lease` renewed in the background
     * (renewals keep the value). `lease.proclaim(v)` changes the value,
     * `lease.release()` resigns: the next candidate in line leads at once. */
    async campaign(key, value, options = {}) {
        (0, keys_js_1.checkValue)(value);
        const keys = new keys_js_1.Keys([key]);
        const timeoutMs = options.timeoutMs ?? Infinity;
        const lease = await this.take(keys, options.ttlMs ?? 30_000, { ...options, timeoutMs }, value);
        if (!lease)
            throw new errors_js_1.NotAcquiredError(`${key} was not granted within ${timeoutMs} ms`);
        return lease;
    }
    /** Who leads `key` now: its fence and value, or null when nobody holds it
     * (`LOCK.OBSERVE key`). */
    async leader(key) {
        new keys_js_1.Keys([key]);
        return (0, keys_js_1.leaderOf)(await this.call(this.client, (0, keys_js_1.observeArgs)(key)));
    }
    /** The leaders of `key` as they change: `for await (const leader of
     * locks.observe(key))` gives `{ fence, value }`, or null for a vacancy;
     * the state now first, then one item per change (a new leader, a
     * vacancy, a proclaim). It holds one connection of its own (a blocked
     * `LOCK.OBSERVE` holds its connection), closed when the loop ends
     * (`break`, `return`, a throw) or `signal` aborts. A lost connection is
     * opened again with a short backoff, and the stream resumes where it
     * was, without a repeat or a miss. Other server errors end it, thrown. */
    observe(key, options = {}) {
        new keys_js_1.Keys([key]);
        const waitMs = (0, keys_js_1.checkMs)(options.checkIntervalMs ?? p.OBSERVE_WAIT_MS, 'checkIntervalMs');
        return this.observing(key, waitMs, options.signal);
    }
    async *observing(key, waitMs, signal) {
        let conn;
        // The last item given; undefined: none yet.
        let last;
        // A blocked OBSERVE whose reply is still to come.
        let pending;
        // Whether the wait names the value last given (see below).
        let exact = true;
        let backoff = OBSERVE_BACKOFF_MS[0];
        const onAbort = () => conn?.destroy();
        signal?.addEventListener('abort', onAbort, { once: true });
        try {
            for (;;) {
                signal?.throwIfAborted();
                let next;
                try {
                    let fresh = false;
                    if (!conn) {
                        conn = await this.client.waitConn();
                        fresh = true;
                        if (signal?.aborted)
                            conn.destroy();
                    }
                    if (fresh) {
                        // First, and after a reconnect: the state now, given if it is
                        // not the last one given.
                        const state = (0, keys_js_1.leaderOf)(await within(conn.send((0, keys_js_1.observeArgs)(key)), p.OBSERVE_GRACE_MS));
                        if (last === undefined || !(0, keys_js_1.sameLeader)(state, last))
                            next = state;
                    }
                    else {
                        if (!pending) {
                            // The state now and a wait for the next change in one write;
                            // the wait names the fence and the value last given, so a
                            // change made since (a proclaim keeps the fence) is answered
                            // at once.
                            const seen = last;
                            const [now, wait] = conn.sendPair((0, keys_js_1.observeArgs)(key), (0, keys_js_1.observeArgs)(key, seen, exact, waitMs));
                            pending = wait;
                            wait.catch(() => { }); // read below, or dropped with the connection
                            const state = (0, keys_js_1.leaderOf)(await within(now, p.OBSERVE_GRACE_MS));
                            if (!(0, keys_js_1.sameLeader)(state, last))
                                next = state;
                        }
                        if (next === undefined) {
                            // Bounded here too: the server answers nil when the wait ends.
                            const reply = await within(pending, waitMs + p.OBSERVE_GRACE_MS);
                            pending = undefined;
                            if (reply !== null && reply !== undefined) {
                                const state = (0, keys_js_1.leaderOf)(reply);
                                if (!(0, keys_js_1.sameLeader)(state, last))
                                    next = state;
                                // Answered though nothing changed: the value read back as a
                                // string is not the bytes the server holds (not UTF-8), so
                                // naming it never matches. Wait on the fence alone for this
                                // leader rather than be answered at once for ever.
                                else
                                    exact = false;
                            }
                        }
                    }
                    backoff = OBSERVE_BACKOFF_MS[0];
                }
                catch (e) {
                    signal?.throwIfAborted();
                    conn?.destroy();
                    conn = undefined;
                    pending = undefined;
                    if (!passing(e))
                        throw (0, errors_js_1.translate)(e, this.client.name);
                    await pause(backoff, signal);
                    backoff = Math.min(backoff * 2, OBSERVE_BACKOFF_MS[1]);
                    continue;
                }
                if (next !== undefined) {
                    last = next;
                    exact = true;
                    yield next;
                }
            }
        }
        finally {
            signal?.removeEventListener('abort', onAbort);
            conn?.destroy();
        }
    }
    /** Closes the idle wait connections (your client is yours), and ends
     * the releases an aborted acquisition left due later, each released once
     * more now: nothing of these locks runs on your client after it. */
    async close() {
        const undoing = [...this.undoing];
        this.undoing.clear();
        for (const [timer] of undoing)
            clearTimeout(timer);
        const tokens = new Map(undoing.map(([, [keys, token]]) => [token, keys]));
        for (const [token, keys] of tokens)
            await this.call(this.client, keys.release(token)).catch(() => { });
        return this.client.close();
    }
    async call(conn, args) {
        try {
            return await conn.send(args);
        }
        catch (e) {
            throw (0, errors_js_1.translate)(e, conn.name);
        }
    }
    async take(keys, ttlMs, o, value) {
        const ttl = (0, keys_js_1.checkMs)(ttlMs, 'ttlMs');
        o.signal?.throwIfAborted();
        const own = o.token === undefined;
        const token = o.token ?? (0, keys_js_1.randomToken)();
        let started = now();
        let fence;
        try {
            const wait = o.timeoutMs ?? 0;
            if (wait === 0) {
                fence = await this.call(this.client, keys.acquire(token, ttl, undefined, value));
            }
            else {
                // BLOCK 0 waits for ever; under a ms waits one.
                const block = wait === Infinity ? 0 : Math.max(1, (0, keys_js_1.checkMs)(wait, 'timeoutMs'));
                fence = await this.wait(keys.acquire(token, ttl, block, value), o.signal);
            }
            // Aborted as the reply came: not taken after all.
            o.signal?.throwIfAborted();
            if (fence === null || fence === undefined)
                return null;
            if (own && now() - started >= ttl / 2) {
                // The wait used up half the lease: renew now, for a validity
                // measured from here.
                started = now();
                fence = (await this.call(this.client, keys.acquire(token, ttl, undefined, value))) ?? fence;
            }
        }
        catch (e) {
            // Aborted, or failed with the request perhaps granted: a token of
            // ours holds nothing the caller will ever see.
            if (own)
                await this.undo(keys, token);
            throw e;
        }
        return new lease_js_1.Lease(this.client, keys, token, Number(fence), ttl, started, o.renew ?? this.renew, value ?? null);
    }
    /** Releases a token of ours that nothing holds for the caller: now, and
     * again a little later. A wait's connection closed on abort may still
     * have been handed the lock before the server saw it close (a reply
     * sent is a grant the server will not take back): the later releases,
     * once the close is seen, undo that grant. */
    async undo(keys, token) {
        const release = () => this.call(this.client, keys.release(token)).catch(() => { });
        await release();
        // Once more after a moment (the server has seen the close by then),
        // before the caller goes on, then in the background.
        await new Promise((r) => setTimeout(r, UNDO_SETTLE_MS));
        await release();
        for (const ms of UNDO_AGAIN_MS) {
            const timer = setTimeout(() => {
                if (this.undoing.delete(timer))
                    void release();
            }, ms);
            timer.unref?.();
            this.undoing.set(timer, [keys, token]);
        }
    }
    /** A BLOCK acquire on a wait connection; an abort closes it at once (the
     * server drops the place in line, or takes back a grant it could not
     * deliver). */
    async wait(args, signal) {
        const conn = await this.client.waitConn();
        return new Promise((resolve, reject) => {
            let settled = false;
            const onAbort = () => {
                settled = true;
                conn.destroy();
                reject(signal?.reason ?? new Error('aborted'));
            };
            if (signal?.aborted)
                return onAbort();
            signal?.addEventListener('abort', onAbort, { once: true });
            conn.send(args).then((reply) => {
                signal?.removeEventListener('abort', onAbort);
                if (settled)
                    return; // aborted meanwhile: closed, its grant undone
                conn.idle();
                resolve(reply);
            }, (e) => {
                signal?.removeEventListener('abort', onAbort);
                conn.destroy();
                if (!settled)
                    reject((0, errors_js_1.translate)(e, conn.name));
            });
        });
    }
}
exports.Locks = Locks;
/** Server errors that pass (a restart loading its data, a failover): an
 * observer rides them out as it does a lost connection. */
const PASSING = new Set(['LOADING', 'UNBLOCKED', 'TRYAGAIN', 'MASTERDOWN', 'BUSY']);
/** An error of the server's (ioredis's `ReplyError`, node-redis's
 * `ErrorReply`), not of the connection. */
function isReply(e) {
    for (let p = e ? Object.getPrototypeOf(e) : null; p && p !== Error.prototype; p = Object.getPrototypeOf(p)) {
        const name = p.constructor?.name;
        if (name === 'ReplyError' || name === 'ErrorReply')
            return true;
    }
    return false;
}
/** A lost connection, or a server error that passes: an observer
 * reconnects and resumes. Not: other server errors, or our own bugs. */
function passing(e) {
    if (!(e instanceof Error) || e instanceof TypeError || e instanceof RangeError || e instanceof ReferenceError)
        return false;
    if (!isReply(e))
        return true;
    return PASSING.has(e.message.split(' ', 1)[0]);
}
/** No answer came within an observer's bound: its connection counts as
 * lost (and is replaced, as a lost one is). */
class SilentConnectionError extends Error {
}
/** `promise`, or a `SilentConnectionError` if it has not settled within
 * `ms`. */
function within(promise, ms) {
    let timer;
    const silent = new Promise((_, reject) => {
        timer = setTimeout(() => reject(new SilentConnectionError(`no answer within ${ms} ms: the connection counts as lost`)), ms);
    });
    return Promise.race([promise, silent]).finally(() => clearTimeout(timer));
}
/** Waits `ms`, or until `signal` aborts. */
function pause(ms, signal) {
    return new Promise((resolve) => {
        const done = () => {
            clearTimeout(timer);
            signal?.removeEventListener('abort', done);
            resolve();
        };
        const timer = setTimeout(done, ms);
        signal?.addEventListener('abort', done, { once: true });
    });
}
function throwLost(keys) {
    throw new errors_js_1.LockLostError(`the lock on ${keys.first} was lost while the routine ran (it may have overlapped another holder)`);
}
