"use strict";
// The user's client, as this package talks to it: ioredis (`Redis`,
// `Cluster`) or node-redis (`createClient`, `createCluster`), told apart by
// their shape. A command is an array of arguments; a reply comes back as
// the client gives it (numbers, strings, null).
Object.defineProperty(exports, "__esModule", { value: true });
exports.wrap = wrap;
const text = (a) => (typeof a === 'number' ? String(a) : a);
function isNodeRedis(client) {
    return typeof client?.sendCommand === 'function' && typeof client?.isOpen === 'boolean';
}
function nameOf(client) {
    const o = client?.options;
    if (o?.host || o?.port)
        return `redis://${o.host ?? '127.0.0.1'}:${o.port ?? 6379}`;
    if (o?.url)
        return String(o.url);
    if (o?.socket?.port)
        return `redis://${o.socket.host ?? '127.0.0.1'}:${o.socket.port}`;
    return 'the server';
}
/** One connection: the user's client, or a wait connection made from it. */
function conn(client, nodeRedis, name) {
    return {
        name,
        send: nodeRedis
            ? (args) => client.sendCommand(args.map(text))
            : (args) => client.call(...args.map(text)),
    };
}
/** The user's client; wait connections are duplicates of it, kept idle
 * between waits (so a grant costs no connection setup). */
function wrap(client) {
    const nodeRedis = isNodeRedis(client);
    if (!nodeRedis && typeof client?.call !== 'function') {
        throw new TypeError('redis-lock-client takes an ioredis client (Redis, Cluster) or a node-redis one (createClient)');
    }
    const name = nameOf(client);
    const idle = [];
    const open = async () => {
        if (nodeRedis) {
            const dup = client.duplicate();
            dup.on?.('error', () => { });
            await dup.connect();
            return dup;
        }
        // No retries, no offline queue: a wait that broke must not be sent
        // again behind the caller's back (it would queue at the back).
        const dup = client.duplicate({
            maxRetriesPerRequest: 0,
            enableOfflineQueue: true,
            commandTimeout: undefined,
            retryStrategy: () => null,
            lazyConnect: false,
        });
        dup.on?.('error', () => { });
        return dup;
    };
    const destroy = (dup) => {
        try {
            if (nodeRedis)
                (dup.destroy ?? dup.disconnect).call(dup);
            else
                dup.disconnect(false);
        }
        catch {
            // already gone
        }
    };
    return {
        ...conn(client, nodeRedis, name),
        async waitConn() {
            const dup = idle.pop() ?? (await open());
            let destroyed = false;
            const c = conn(dup, nodeRedis, name);
            return {
                ...c,
                sendPair: (a, b) => {
                    // node-redis writes the commands of one tick together; ioredis
                    // writes each at once, so its socket is corked around them.
                    const stream = nodeRedis ? undefined : dup.stream;
                    stream?.cork?.();
                    try {
                        return [c.send(a), c.send(b)];
                    }
                    finally {
                        stream?.uncork?.();
                    }
                },
                idle: () => {
                    // Only a connection still open and never closed here: a close
                    // takes a moment to show in the client's state.
                    const open = nodeRedis ? dup.isOpen : dup.status === 'ready';
                    if (!destroyed && open)
                        idle.push(dup);
                },
                destroy: () => {
                    destroyed = true;
                    destroy(dup);
                },
            };
        },
        async close() {
            while (idle.length)
                destroy(idle.pop());
        },
    };
}
