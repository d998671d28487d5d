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
exports.wrap = wrap;
// The user's client, as this package talks to it: ioredis (`Redis`,
// `Cluster`) or node-redis (`createClient`, `createCluster`), told apart by
// their shape. A command is an array of arguments; a reply comes back as
// the client gives it (numbers, strings, null).
const p = __importStar(require("./protocol.js"));
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
    if (nodeRedis)
        return { name, send: (args) => client.sendCommand(args.map(text)) };
    const prefix = keyPrefixOf(client);
    const call = (args) => client.call(...args.map(text));
    return {
        name,
        // Async: a command that cannot be prefixed is a rejected promise, as
        // every other failure of a send.
        send: prefix === undefined ? call : async (args) => call(withKeyPrefix(client, prefix, args)),
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
// ---- ioredis's `keyPrefix` ----
// ioredis prefixes the keys of the commands it knows; the LOCK.* commands
// are not among them, so without this a lock, a gate and a guarded write
// would name the bare key while the user's own commands name the prefixed
// one (a fenced `SET stock` written where `get('stock')` never reads).
/** The key prefix of an ioredis client (`Redis` or `Cluster`), if it has
 * one. node-redis has none. */
function keyPrefixOf(client) {
    const prefix = client?.options?.keyPrefix;
    return prefix === undefined || prefix === null || prefix.length === 0 ? undefined : prefix;
}
/** `command` with its keys prefixed as ioredis prefixes them when the
 * client sends it itself: read from an ioredis pipeline the command is put
 * into and that is never sent (ioredis has no other way to it; its key
 * positions are its own table's). None if the client has no pipelines. */
function asIoredisSends(client, command) {
    const pipeline = typeof client?.pipeline === 'function' ? client.pipeline() : undefined;
    if (typeof pipeline?.call !== 'function')
        return undefined;
    pipeline.call(...command.map(text));
    const args = pipeline._queue?.[0]?.args;
    return Array.isArray(args) ? [command[0], ...args] : undefined;
}
const prefixed = (prefix, key) => {
    if (typeof prefix === 'string' && !Buffer.isBuffer(key))
        return prefix + String(key);
    const bytes = (a) => (Buffer.isBuffer(a) ? a : Buffer.from(String(a)));
    return Buffer.concat([bytes(prefix), bytes(key)]);
};
/** `args` (a module command) with `client`'s key prefix on every key it
 * names: the lock's keys, a gate, and the keys of the command it runs
 * (`LOCK.EXEC`, `LOCK.FENCED`) as ioredis prefixes that command's own. */
function withKeyPrefix(client, prefix, args) {
    const out = [...args];
    const key = (i) => {
        if (i < out.length)
            out[i] = prefixed(prefix, out[i]);
    };
    let inner;
    switch (String(args[0]).toUpperCase()) {
        case p.ACQUIRE_ALL:
        case p.RELEASE_ALL: {
            const n = Math.min(Number(args[1]), out.length - 2);
            for (let i = 0; i < n; i++)
                key(2 + i);
            break;
        }
        case p.EXEC:
            key(1);
            inner = 5; // LOCK.EXEC key token FENCE fence command...
            break;
        case p.FENCED:
            key(1);
            inner = 3; // LOCK.FENCED gate fence command...
            break;
        case p.ACQUIRE:
        case p.RELEASE:
        case p.EXTEND:
        case p.FENCE:
        case p.INFO:
        case p.OBSERVE:
            key(1);
            break;
        default:
            return args; // not a module command: ioredis's own
    }
    if (inner !== undefined && out.length > inner) {
        const command = asIoredisSends(client, out.slice(inner));
        if (!command) {
            throw new TypeError('the client has a keyPrefix, but it makes no ioredis pipeline to prefix the keys of the command run under the lock');
        }
        out.splice(inner, out.length - inner, ...command);
    }
    return out;
}
