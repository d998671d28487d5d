// The user's client, as this package talks to it: ioredis (`Redis`,
// `Cluster`) or node-redis (`createClient`, `createCluster`), told apart by
// their shape. A command is an array of arguments; a reply comes back as
// the client gives it (numbers, strings, null).
import * as p from './protocol.js';

/** An argument of a command. */
export type Arg = string | number | Buffer;

/** What this package needs of a connection. */
export interface Conn {
  /** Sends one command; its reply. */
  send(args: Arg[]): Promise<unknown>;
  /** `host:port` (or the cluster), for messages. */
  readonly name: string;
}

/** A connection of its own for a blocking wait (a BLOCKed command holds its
 * connection: ioredis and node-redis queue everything behind it). */
export interface WaitConn extends Conn {
  /** Sends two commands in one write (the server runs them in one go);
   * their replies. */
  sendPair(a: Arg[], b: Arg[]): [Promise<unknown>, Promise<unknown>];
  /** Done with it: back to the pool. */
  idle(): void;
  /** Closed at once (an aborted wait: the server drops its place in line,
   * or takes back a grant it could not deliver). */
  destroy(): void;
}

/** ioredis or node-redis, as the user made it. */
// eslint-disable-next-line @typescript-eslint/no-explicit-any
export type RedisLike = any;

/** The user's client as a [`Conn`] that can open wait connections. */
export interface Client extends Conn {
  /** A connection for a blocking wait (from a pool of idle ones). */
  waitConn(): Promise<WaitConn>;
  /** Closes the idle wait connections. */
  close(): Promise<void>;
}

const text = (a: Arg): string | Buffer => (typeof a === 'number' ? String(a) : a);

function isNodeRedis(client: RedisLike): boolean {
  return typeof client?.sendCommand === 'function' && typeof client?.isOpen === 'boolean';
}

function nameOf(client: RedisLike): string {
  const o = client?.options;
  if (o?.host || o?.port) return `redis://${o.host ?? '127.0.0.1'}:${o.port ?? 6379}`;
  if (o?.url) return String(o.url);
  if (o?.socket?.port) return `redis://${o.socket.host ?? '127.0.0.1'}:${o.socket.port}`;
  return 'the server';
}

/** One connection: the user's client, or a wait connection made from it. */
function conn(client: RedisLike, nodeRedis: boolean, name: string): Conn {
  if (nodeRedis) return { name, send: (args) => client.sendCommand(args.map(text)) };
  const prefix = keyPrefixOf(client);
  const call = (args: Arg[]) => client.call(...(args.map(text) as [string, ...Arg[]]));
  return {
    name,
    // Async: a command that cannot be prefixed is a rejected promise, as
    // every other failure of a send.
    send: prefix === undefined ? call : async (args) => call(withKeyPrefix(client, prefix, args)),
  };
}

/** The user's client; wait connections are duplicates of it, kept idle
 * between waits (so a grant costs no connection setup). */
export function wrap(client: RedisLike): Client {
  const nodeRedis = isNodeRedis(client);
  if (!nodeRedis && typeof client?.call !== 'function') {
    throw new TypeError('redis-lock-client takes an ioredis client (Redis, Cluster) or a node-redis one (createClient)');
  }
  const name = nameOf(client);
  const idle: RedisLike[] = [];
  const open = async (): Promise<RedisLike> => {
    if (nodeRedis) {
      const dup = client.duplicate();
      dup.on?.('error', () => {});
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
    dup.on?.('error', () => {});
    return dup;
  };
  const destroy = (dup: RedisLike) => {
    try {
      if (nodeRedis) (dup.destroy ?? dup.disconnect).call(dup);
      else dup.disconnect(false);
    } catch {
      // already gone
    }
  };
  return {
    ...conn(client, nodeRedis, name),
    async waitConn(): Promise<WaitConn> {
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
          } finally {
            stream?.uncork?.();
          }
        },
        idle: () => {
          // Only a connection still open and never closed here: a close
          // takes a moment to show in the client's state.
          const open = nodeRedis ? dup.isOpen : dup.status === 'ready';
          if (!destroyed && open) idle.push(dup);
        },
        destroy: () => {
          destroyed = true;
          destroy(dup);
        },
      };
    },
    async close(): Promise<void> {
      while (idle.length) destroy(idle.pop());
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
function keyPrefixOf(client: RedisLike): string | Buffer | undefined {
  const prefix = client?.options?.keyPrefix;
  return prefix === undefined || prefix === null || prefix.length === 0 ? undefined : prefix;
}

/** `command` with its keys prefixed as ioredis prefixes them when the
 * client sends it itself: read from an ioredis pipeline the command is put
 * into and that is never sent (ioredis has no other way to it; its key
 * positions are its own table's). None if the client has no pipelines. */
function asIoredisSends(client: RedisLike, command: Arg[]): Arg[] | undefined {
  const pipeline = typeof client?.pipeline === 'function' ? client.pipeline() : undefined;
  if (typeof pipeline?.call !== 'function') return undefined;
  pipeline.call(...command.map(text));
  const args = pipeline._queue?.[0]?.args;
  return Array.isArray(args) ? [command[0], ...args] : undefined;
}

const prefixed = (prefix: string | Buffer, key: Arg): Arg => {
  if (typeof prefix === 'string' && !Buffer.isBuffer(key)) return prefix + String(key);
  const bytes = (a: Arg | string) => (Buffer.isBuffer(a) ? a : Buffer.from(String(a)));
  return Buffer.concat([bytes(prefix), bytes(key)]);
};

/** `args` (a module command) with `client`'s key prefix on every key it
 * names: the lock's keys, a gate, and the keys of the command it runs
 * (`LOCK.EXEC`, `LOCK.FENCED`) as ioredis prefixes that command's own. */
function withKeyPrefix(client: RedisLike, prefix: string | Buffer, args: Arg[]): Arg[] {
  const out = [...args];
  const key = (i: number) => {
    if (i < out.length) out[i] = prefixed(prefix, out[i]);
  };
  let inner: number | undefined;
  switch (String(args[0]).toUpperCase()) {
    case p.ACQUIRE_ALL:
    case p.RELEASE_ALL: {
      const n = Math.min(Number(args[1]), out.length - 2);
      for (let i = 0; i < n; i++) key(2 + i);
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
