// Taking locks: `Locks` over the user's own client.
import { wrap } from './client.js';
import { LockLostError, NotAcquiredError, translate } from './errors.js';
import { checkMs, Keys, randomToken } from './keys.js';
import { Lease } from './lease.js';
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
export class Locks {
    client;
    renew;
    constructor(client, options = {}) {
        this.client = wrap(client);
        this.renew = options.renew ?? true;
    }
    /** Takes the lock on `key` for `ttlMs`: a `Lease`, or null if another
     * holder has it and `timeoutMs` passed. A wait stands in the server's FIFO
     * line and is handed the lock the moment it frees. */
    async acquire(key, ttlMs, options = {}) {
        return this.take(new Keys([key], options.shared, options.limit), ttlMs, options);
    }
    /** Every key, all or nothing, with one fence (`LOCK.ACQUIREALL`). */
    async acquireAll(keys, ttlMs, options = {}) {
        return this.take(new Keys(keys, options.shared, options.limit), ttlMs, options);
    }
    async using(key, ttlMs, a, b) {
        const [options, routine] = typeof a === 'function' ? [{}, a] : [a, b];
        const keys = new Keys(Array.isArray(key) ? key : [key], options.shared, options.limit);
        const lease = await this.take(keys, ttlMs, { timeoutMs: Infinity, renew: true, ...options });
        if (!lease)
            throw new NotAcquiredError(`${keys.first} was not granted within ${options.timeoutMs} ms`);
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
    /** Closes the idle wait connections (your client is yours). */
    close() {
        return this.client.close();
    }
    async call(conn, args) {
        try {
            return await conn.send(args);
        }
        catch (e) {
            throw translate(e, conn.name);
        }
    }
    async take(keys, ttlMs, o) {
        const ttl = checkMs(ttlMs, 'ttlMs');
        o.signal?.throwIfAborted();
        const own = o.token === undefined;
        const token = o.token ?? randomToken();
        let started = now();
        let fence;
        try {
            const wait = o.timeoutMs ?? 0;
            if (wait === 0) {
                fence = await this.call(this.client, keys.acquire(token, ttl));
            }
            else {
                // BLOCK 0 waits for ever; under a ms waits one.
                const block = wait === Infinity ? 0 : Math.max(1, checkMs(wait, 'timeoutMs'));
                fence = await this.wait(keys.acquire(token, ttl, block), o.signal);
            }
            // Aborted as the reply came: not taken after all.
            o.signal?.throwIfAborted();
            if (fence === null || fence === undefined)
                return null;
            if (own && now() - started >= ttl / 2) {
                // The wait used up half the lease: renew now, for a validity
                // measured from here.
                started = now();
                fence = (await this.call(this.client, keys.acquire(token, ttl))) ?? fence;
            }
        }
        catch (e) {
            // Aborted, or failed with the request perhaps granted: a token of
            // ours holds nothing the caller will ever see.
            if (own)
                await this.undo(keys, token);
            throw e;
        }
        return new Lease(this.client, keys, token, Number(fence), ttl, started, o.renew ?? this.renew);
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
        for (const ms of UNDO_AGAIN_MS)
            setTimeout(release, ms).unref?.();
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
                    reject(translate(e, conn.name));
            });
        });
    }
}
function throwLost(keys) {
    throw new LockLostError(`the lock on ${keys.first} was lost while the routine ran (it may have overlapped another holder)`);
}
