// The package against a real server with the module, over ioredis and
// node-redis both.
import assert from 'node:assert/strict';
import { test } from 'node:test';

import {
  Locks,
  LockLostError,
  ModuleMissingError,
  NotAcquiredError,
  NotHeldError,
  StaleFenceError,
} from 'redis-lock-client';

import { CLIENTS } from './clients.mjs';
import { Proxy, Server } from './server.mjs';

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

/** Runs `body(locks, server, client)` for each client, on a fresh server. */
function each(name, body, options = {}) {
  for (const kind of CLIENTS) {
    test(`${name} (${kind.name})`, async () => {
      const server = await Server.start(options);
      const client = await kind.open(server.port);
      const locks = new Locks(client, options.locks);
      try {
        await body(locks, server, client, kind);
      } finally {
        await locks.close();
        await kind.close(client).catch(() => {});
        await server.stop();
      }
    });
  }
}

each('a grant has a fence, and a release frees the key', async (locks, server) => {
  const lease = await locks.acquire('order:42', 30_000);
  assert.ok(lease && lease.fence > 1e15 && Number.isSafeInteger(lease.fence));
  assert.equal(await server.command('LOCK.FENCE', 'order:42'), lease.fence);
  assert.equal(await locks.acquire('order:42', 30_000), null, 'held by another');
  assert.equal(await lease.release(), true);
  assert.equal(await server.command('LOCK.FENCE', 'order:42'), null);
  const again = await locks.acquire('order:42', 30_000);
  assert.ok(again.fence > lease.fence, 'fences rise');
  await again[Symbol.asyncDispose]();
  assert.equal(await server.command('LOCK.FENCE', 'order:42'), null, 'disposed: released');
});

each('a wait stands in the server line and is handed the lock at once', async (locks, server) => {
  const first = await locks.acquire('job', 30_000);
  const waiting = locks.acquire('job', 30_000, { timeoutMs: 10_000 });
  while ((await server.info('waiters')) !== 1) await sleep(10);
  const released = performance.now();
  await first.release();
  const lease = await waiting;
  assert.ok(lease.fence > first.fence);
  assert.ok(performance.now() - released < 1000, 'handed over, no polling');
  assert.equal(await server.info('handoffs'), 1);
  await lease.release();
  const held = await locks.acquire('job', 30_000);
  assert.equal(await locks.acquire('job', 30_000, { timeoutMs: 200 }), null);
  assert.equal(await server.info('waiters'), 0);
  await held.release();
});

each('using renews, releases, and reports a lock lost meanwhile', async (locks, server) => {
  const out = await locks.using('k', 300, async (signal, lease) => {
    await sleep(1000);
    assert.equal(signal.aborted, false);
    assert.equal(await server.command('LOCK.FENCE', 'k'), lease.fence);
    return 42;
  });
  assert.equal(out, 42);
  assert.equal(await server.command('LOCK.FENCE', 'k'), null);
  assert.ok((await server.info('extends')) >= 2);
  await assert.rejects(
    locks.using('short', 300, { renew: false }, async (signal) => {
      await new Promise((r) => signal.addEventListener('abort', r, { once: true }));
    }),
    LockLostError,
  );
  const held = await locks.acquire('busy', 30_000);
  await assert.rejects(locks.using('busy', 30_000, { timeoutMs: 100 }, async () => 1), NotAcquiredError);
  await held.release();
});

each('exec and fenced write only for the current holder', async (locks, server, client) => {
  const old = await locks.acquire('doc', 200, { renew: false });
  assert.equal(await old.exec(['SET', 'doc:body', 'v1']), 'OK');
  assert.equal(await old.fenced('doc:gate', ['SET', 'doc:copy', 'v1']), 'OK');
  await sleep(350);
  await assert.rejects(old.exec(['SET', 'doc:body', 'stale']), NotHeldError);
  const fresh = await locks.acquire('doc', 30_000);
  assert.equal(await fresh.fenced('doc:gate', ['SET', 'doc:copy', 'v2'], client), 'OK');
  const e = await old.fenced('doc:gate', ['SET', 'doc:copy', 'stale']).catch((x) => x);
  assert.ok(e instanceof StaleFenceError, String(e));
  assert.deepEqual([e.fence, e.mark], [old.fence, fresh.fence]);
  assert.equal(await server.command('GET', 'doc:body'), 'v1');
  assert.equal(await server.command('GET', 'doc:copy'), 'v2');
  await fresh.release();
});

each('acquireAll, shared holders and a semaphore', async (locks, server) => {
  const both = await locks.acquireAll(['{o}a', '{o}b'], 30_000);
  assert.equal(await server.command('LOCK.FENCE', '{o}a'), both.fence);
  assert.equal(await server.command('LOCK.FENCE', '{o}b'), both.fence);
  assert.equal(await locks.acquireAll(['{o}b', '{o}c'], 30_000), null);
  assert.equal(await server.command('EXISTS', '{o}c'), 0, 'all or nothing');
  await both.release();
  const r1 = await locks.acquire('report', 30_000, { shared: true });
  const r2 = await locks.acquire('report', 30_000, { shared: true });
  assert.ok(r1 && r2 && r1.fence !== r2.fence);
  assert.equal(await locks.acquire('report', 30_000), null, 'the writer waits');
  const permits = [];
  for (let i = 0; i < 3; i++) permits.push(await locks.acquire('sem', 30_000, { limit: 2 }));
  assert.ok(permits[0] && permits[1] && permits[2] === null);
  for (const l of [r1, r2, permits[0], permits[1]]) await l.release();
});

each('bad arguments are refused before anything is sent', async (locks, server) => {
  for (const bad of [0, -1, NaN, Infinity]) await assert.rejects(locks.acquire('k', bad), RangeError);
  await assert.rejects(locks.acquire('', 1000), RangeError);
  await assert.rejects(locks.acquireAll(['a', 'a'], 1000), RangeError);
  await assert.rejects(locks.acquire('k', 1000, { limit: 0 }), RangeError);
  assert.equal(await server.command('DBSIZE'), 0);
});

each('an aborted wait leaves no lock and no place in line', async (locks, server) => {
  // Aborted at random moments while the holder releases at random moments.
  let aborted = 0;
  for (let round = 0; round < 30; round++) {
    const key = `abort:${round}`;
    const holder = await locks.acquire(key, 30_000);
    const controller = new AbortController();
    const waiting = locks.acquire(key, 30_000, { timeoutMs: 5000, signal: controller.signal });
    const releasing = sleep(Math.random() * 30).then(() => holder.release());
    await sleep(Math.random() * 30);
    controller.abort();
    try {
      const lease = await waiting;
      if (lease) await lease.release();
    } catch (e) {
      aborted += 1;
      assert.equal(e?.name, 'AbortError', String(e));
    }
    await releasing;
    const deadline = Date.now() + 2000;
    while ((await server.command('LOCK.FENCE', key)) !== null || (await server.info('waiters')) !== 0) {
      assert.ok(Date.now() < deadline, `round ${round}: a lock or a waiter was left`);
      await sleep(10);
    }
  }
  assert.ok(aborted > 0);
});

each('close ends the releases an aborted wait left due later', async (locks, server) => {
  // Each token is released once more at the close; after it nothing of
  // these locks runs on the client (it is the caller's to close next).
  const releases = async () => {
    const text = await server.command('INFO', 'commandstats');
    return Number(/cmdstat_lock\.release:calls=(\d+)/.exec(text)?.[1] ?? 0);
  };
  const keys = [0, 1, 2, 3, 4].map((i) => `undo:${i}`);
  for (const key of keys) {
    const holder = await locks.acquire(key, 30_000);
    const controller = new AbortController();
    const waiting = locks.acquire(key, 30_000, { timeoutMs: 5000, signal: controller.signal });
    await eventually(async () => (await server.info('waiters')) === 1, 'the waiter waits');
    controller.abort();
    await assert.rejects(waiting, (e) => e?.name === 'AbortError');
    await holder.release();
  }
  await locks.close();
  const closed = await releases();
  await sleep(Math.max(...[250, 1000]) + 500);
  assert.equal(await releases(), closed, 'no release ran after close');
  for (const key of keys) assert.equal(await server.command('LOCK.FENCE', key), null);
});

each(
  'a server without the module says how to load it',
  async (locks) => {
    const e = await locks.acquire('k', 30_000).catch((x) => x);
    assert.ok(e instanceof ModuleMissingError, String(e));
    assert.match(e.message, /--loadmodule/);
  },
  { module: false },
);

// ---- leader election ----

/** An observer read as its items come: `next(ms)` is the next one, or
 * NOTHING if none came within ms. */
const NOTHING = Symbol('nothing');
function reader(iterable) {
  const iterator = iterable[Symbol.asyncIterator]();
  let pending;
  return {
    async next(ms = 5000) {
      pending ??= iterator.next();
      const got = await Promise.race([pending, sleep(ms).then(() => NOTHING)]);
      if (got === NOTHING) return NOTHING;
      pending = undefined;
      return got.done ? 'done' : got.value;
    },
    return: () => iterator.return(),
  };
}

async function observerIds(server) {
  const list = await server.command('CLIENT', 'LIST');
  return list.split('\n').filter((l) => / cmd=lock\.observe /.test(l)).map((l) => / id=(\d+) /.exec(` ${l}`)[1]);
}

async function blockedClients(server) {
  const text = await server.command('INFO', 'clients');
  return Number(/blocked_clients:(\d+)/.exec(text)[1]);
}

async function eventually(check, what = 'not in time', ms = 5000) {
  const deadline = Date.now() + ms;
  while (!(await check())) {
    assert.ok(Date.now() < deadline, what);
    await sleep(10);
  }
}

each('a campaign waits in line and leads when the leader resigns; a timeout throws', async (locks, server) => {
  assert.equal(await locks.leader('election'), null);
  const a = await locks.campaign('election', 'node-a');
  assert.equal(a.value, 'node-a');
  assert.deepEqual(await locks.leader('election'), { fence: a.fence, value: 'node-a' });
  await assert.rejects(locks.campaign('election', 'node-b', { timeoutMs: 0 }), NotAcquiredError);
  await assert.rejects(locks.campaign('election', 'node-b', { timeoutMs: 200 }), NotAcquiredError);
  assert.equal(await server.info('waiters'), 0);
  const waiting = locks.campaign('election', 'node-b', { ttlMs: 30_000 });
  await eventually(async () => (await server.info('waiters')) === 1, 'the candidate waits in line');
  assert.equal(await a.release(), true);
  const b = await waiting;
  assert.ok(b.fence > a.fence);
  assert.equal(b.value, 'node-b');
  assert.deepEqual(await locks.leader('election'), { fence: b.fence, value: 'node-b' });
  await b[Symbol.asyncDispose]();
  assert.equal(await locks.leader('election'), null);
  await assert.rejects(locks.campaign('election', 42), TypeError);
});

each('a proclaim is seen by an observer; renewals keep the value; a resignation is a vacancy', async (locks) => {
  const a = await locks.campaign('election', 'v1', { ttlMs: 600 }); // renewed every 200 ms
  const changes = reader(locks.observe('election'));
  assert.deepEqual(await changes.next(), { fence: a.fence, value: 'v1' }, 'the state now first');
  await a.proclaim('v2');
  assert.equal(a.value, 'v2');
  assert.deepEqual(await changes.next(), { fence: a.fence, value: 'v2' });
  assert.deepEqual(await locks.leader('election'), { fence: a.fence, value: 'v2' });
  assert.equal(await changes.next(1000), NOTHING, 'renewals tell observers nothing');
  assert.ok(a.isValid());
  assert.deepEqual(await locks.leader('election'), { fence: a.fence, value: 'v2' });
  assert.equal(await a.release(), true);
  assert.equal(await changes.next(), null);
  await assert.rejects(a.proclaim('v3'), /not held/);
  await changes.return();
});

each('an observer of a value that is not UTF-8 waits without spinning', async (locks, server) => {
  // A writer's binary value (a Lua escape makes the byte 0xff): it reads
  // back as a string of other bytes, so a wait naming it would be answered
  // at once for ever; the observer then waits on the fence alone.
  const fence = await server.command(
    'EVAL',
    "return redis.call('LOCK.ACQUIRE', KEYS[1], 'tok', '60000', 'VALUE', '\\255a')",
    '1',
    'election',
  );
  const calls = async () => {
    const stats = await server.command('INFO', 'commandstats');
    return Number(/cmdstat_lock\.observe:calls=(\d+)/.exec(stats)?.[1] ?? 0);
  };
  const changes = reader(locks.observe('election'));
  const first = await changes.next();
  assert.equal(first.fence, fence);
  const before = await calls();
  assert.equal(await changes.next(1000), NOTHING, 'nothing changed');
  assert.ok((await calls()) - before < 10, 'no loop of waits answered at once');
  assert.equal(await server.command('LOCK.RELEASE', 'election', 'tok'), 1);
  assert.equal(await changes.next(), null, 'told of the vacancy');
  await changes.return();
});

each('a proclaim after the lease ended is lost and grants nothing', async (locks, server) => {
  // The lease ends in the server while this client still counts it held.
  let a = await locks.campaign('election', 'v1');
  assert.equal(await server.command('LOCK.RELEASE', 'election', a.token), 1);
  const grants = await server.info('grants');
  await assert.rejects(a.proclaim('v2'), LockLostError);
  assert.equal(await server.info('grants'), grants, 'LOCK.EXTEND: no grant, not one given back');
  assert.equal(a.signal.aborted, true);
  assert.equal(a.isValid(), false);
  assert.equal(a.value, 'v1');
  assert.equal(await server.command('LOCK.INFO', 'election'), null, 'the free key stays free');
  // Again, with the key taken by another meanwhile: it stays theirs.
  a = await locks.campaign('election', 'v1');
  assert.equal(await server.command('LOCK.RELEASE', 'election', a.token), 1);
  const b = await locks.campaign('election', 'b');
  await assert.rejects(a.proclaim('v2'), LockLostError);
  assert.equal(a.signal.aborted, true);
  assert.deepEqual(await locks.leader('election'), { fence: b.fence, value: 'b' });
  assert.equal(await server.command('LOCK.FENCE', 'election'), b.fence);
  assert.equal(await b.release(), true);
});

each(
  'an observer is told when a lease ends with no command',
  async (locks) => {
    const changes = reader(locks.observe('election'));
    assert.equal(await changes.next(), null, 'vacant at first');
    const a = await locks.campaign('election', 'v1', { ttlMs: 500 }); // not renewed
    assert.deepEqual(await changes.next(), { fence: a.fence, value: 'v1' });
    const started = Date.now();
    assert.equal(await changes.next(10_000), null, 'the lease ended: vacant');
    assert.ok(Date.now() - started < 5000); // generous: the lease was 500 ms
    await changes.return();
  },
  { locks: { renew: false } },
);

each('a break closes the observer: no blocked client is left; an abort ends it too', async (locks, server) => {
  const lease = await locks.campaign('election', 'v1');
  for await (const change of locks.observe('election')) {
    assert.deepEqual(change, { fence: lease.fence, value: 'v1' });
    break;
  }
  await eventually(async () => (await observerIds(server)).length === 0, 'the connection is closed');
  const controller = new AbortController();
  const seen = [];
  const loop = (async () => {
    for await (const change of locks.observe('election', { signal: controller.signal })) seen.push(change);
  })();
  await eventually(async () => (await blockedClients(server)) === 1, 'the observer blocks in the server');
  controller.abort();
  await assert.rejects(loop, (e) => e?.name === 'AbortError');
  assert.deepEqual(seen, [{ fence: lease.fence, value: 'v1' }]);
  await eventually(async () => (await blockedClients(server)) === 0 && (await observerIds(server)).length === 0,
    'no blocked client left');
  await lease.release();
});

for (const kind of CLIENTS) {
  // Its connection stays open but carries nothing (a host gone, a NAT that
  // forgot the flow): without a bound of its own the observer waited for
  // ever and missed the leader.
  test(`an observer replaces a connection that went quiet (${kind.name})`, async () => {
    const server = await Server.start();
    const proxy = await Proxy.start(server.port);
    const direct = await kind.open(server.port);
    const via = await kind.open(proxy.port);
    const locks = new Locks(direct);
    const quietLocks = new Locks(via);
    // Ends the observer whatever happened (a failed assertion leaves it
    // waiting, which would keep the test process alive).
    const stop = new AbortController();
    try {
      const changes = reader(quietLocks.observe('election', { checkIntervalMs: 200, signal: stop.signal }));
      assert.equal(await changes.next(), null, 'vacant at first');
      const waiting = changes.next(20_000);
      await eventually(async () => (await blockedClients(server)) === 1, 'the observer waits in the server');
      proxy.silence();
      const a = await locks.campaign('election', 'v1');
      // The wait (0.2 s) and the grace (5 s), then a new connection.
      assert.deepEqual(await waiting, { fence: a.fence, value: 'v1' }, 'told through a new connection');
      assert.ok(proxy.connections >= 2);
      await a.release();
      assert.equal(await changes.next(), null);
      await changes.return();
      assert.throws(() => quietLocks.observe('election', { checkIntervalMs: 0 }), RangeError);
      assert.throws(() => quietLocks.observe('election', { checkIntervalMs: Infinity }), /checkIntervalMs/);
    } finally {
      stop.abort();
      // The proxy first: what still goes through it (a quit on a silenced
      // connection) fails then rather than waiting.
      await proxy.close();
      await quietLocks.close().catch(() => {});
      await locks.close();
      await kind.close(direct).catch(() => {});
      if (via.disconnect) via.disconnect();
      else await kind.close(via).catch(() => {});
      await server.stop();
    }
  });
}

each('observers aborted at random moments end at once and leave no connection', async (locks, server) => {
  // Aborted while connecting, reading the state, sending the wait or in
  // it: each loop ends within a second, and no observer's connection is
  // left open behind it.
  const lease = await locks.campaign('closing', 'v', 5000);
  const before = (await server.command('CLIENT', 'LIST')).trim().split('\n').length;
  for (let round = 0; round < 30; round++) {
    const controller = new AbortController();
    const loop = (async () => {
      for await (const _ of locks.observe('closing', { signal: controller.signal }));
    })();
    await sleep(Math.random() * 20);
    controller.abort();
    const ended = await Promise.race([loop.then(() => 'done', () => 'done'), sleep(1000).then(() => 'waiting')]);
    assert.equal(ended, 'done', `round ${round}: an abort ends the loop at once`);
  }
  await eventually(async () => (await blockedClients(server)) === 0 && (await observerIds(server)).length === 0,
    "no aborted observer's connection left open");
  const after = (await server.command('CLIENT', 'LIST')).trim().split('\n').length;
  assert.ok(after <= before, `connections: ${before} before, ${after} after`);
  await lease.release();
});

// An ACL user with the lock commands alone (no INFO, no CLIENT): the
// package sends nothing else, so every part of it works for that user.
const LOCK_ONLY_USER = ['~app:*', '+lock.acquire', '+lock.release', '+lock.extend', '+lock.info', '+lock.fence',
  '+lock.acquireall', '+lock.releaseall', '+lock.observe'];
each('a user with only the lock commands locks, waits, renews and observes', async (_, server, __, kind) => {
  await server.command('ACL', 'SETUSER', 'app', 'on', '>pw', ...LOCK_ONLY_USER);
  const client = await kind.open(server.port, { username: 'app', password: 'pw' });
  const locks = new Locks(client);
  try {
    const first = await locks.acquire('app:k', 5000);
    const waiting = locks.acquire('app:k', 5000, { timeoutMs: 5000 });
    await eventually(async () => (await server.info('waiters')) === 1, 'the waiter waits in line');
    assert.equal(await first.release(), true);
    const second = await waiting;
    assert.ok(second.fence > first.fence);
    assert.equal(await second.release(), true);
    const renewed = await locks.acquire('app:renewed', 600);
    await sleep(1000); // renewals ran
    assert.equal(await renewed.release(), true, 'renewed past its first lease');
    const both = await locks.acquireAll(['app:a', 'app:b'], 5000);
    assert.equal(await both.release(), true);
    const lead = await locks.campaign('app:leader', 'v1', 5000);
    assert.deepEqual(await locks.leader('app:leader'), { fence: lead.fence, value: 'v1' });
    for await (const change of locks.observe('app:leader')) {
      assert.deepEqual(change, { fence: lead.fence, value: 'v1' });
      break;
    }
    assert.equal(await lead.release(), true);
  } finally {
    await locks.close();
    await kind.close(client).catch(() => {});
  }
  assert.ok(!/NOPERM/.test(server.log()));
});

/** Three masters on loopback, slots split between them, ready on each. */
async function startCluster() {
  const nodes = [];
  for (let i = 0; i < 3; i++) {
    nodes.push(await Server.start({ args: ['--cluster-enabled', 'yes', '--cluster-node-timeout', '5000'] }));
  }
  const ranges = [[0, 5460], [5461, 10922], [10923, 16383]];
  for (const [i, s] of nodes.entries()) await s.command('CLUSTER', 'ADDSLOTSRANGE', ...ranges[i].map(String));
  for (const s of nodes.slice(1)) await nodes[0].command('CLUSTER', 'MEET', '127.0.0.1', String(s.port), String(s.busPort));
  await eventually(async () => {
    for (const s of nodes) {
      if (!/cluster_state:ok/.test(await s.command('CLUSTER', 'INFO'))) return false;
      if (!/cluster_known_nodes:3/.test(await s.command('CLUSTER', 'INFO'))) return false;
    }
    return true;
  }, 'the cluster did not come up', 20000);
  return nodes;
}

test('on a three-node ioredis Cluster each key locks, waits and observes on its node', async () => {
  const { default: Redis } = await import('ioredis');
  const nodes = await startCluster();
  const client = new Redis.Cluster([{ host: '127.0.0.1', port: nodes[0].port }]);
  const locks = new Locks(client);
  try {
    // A key served by each node (CLUSTER KEYSLOT, then the node's range).
    const keys = [];
    const bounds = [5460, 10922, 16383];
    for (let i = 0; keys.filter(Boolean).length < 3; i++) {
      const slot = Number(await nodes[0].command('CLUSTER', 'KEYSLOT', `job:${i}`));
      const at = bounds.findIndex((hi) => slot <= hi);
      keys[at] ??= `job:${i}`;
    }
    for (const [i, key] of keys.entries()) {
      const first = await locks.acquire(key, 5000);
      const waiting = locks.acquire(key, 5000, { timeoutMs: 5000 });
      await eventually(async () => (await nodes[i].info('waiters')) === 1, `${key} waits on its node`);
      assert.equal(await first.release(), true);
      const second = await waiting;
      assert.ok(second.fence > first.fence);
      assert.equal(await second.exec(['SET', `{${key}}data`, 'x']), 'OK');
      assert.equal(await nodes[i].command('GET', `{${key}}data`), 'x');
      assert.equal(await second.release(), true);
    }
    const renewed = await locks.acquire('{t}renewed', 600);
    await sleep(1000);
    assert.equal(await renewed.release(), true, 'renewed on its node');
    const both = await locks.acquireAll(['{t}a', '{t}b'], 5000);
    assert.equal(await both.release(), true);
    const lead = await locks.campaign(keys[2], 'v1', 5000);
    const seen = [];
    for await (const change of locks.observe(keys[2])) {
      seen.push(change);
      if (seen.length === 1) await lead.proclaim('v2');
      else break;
    }
    assert.deepEqual(seen, [{ fence: lead.fence, value: 'v1' }, { fence: lead.fence, value: 'v2' }]);
    assert.equal(await lead.release(), true);
  } finally {
    await locks.close();
    client.disconnect();
    for (const s of nodes) await s.stop();
  }
});

each('an observer resumes after its connection is killed, without a repeat or a miss', async (locks, server) => {
  const a = await locks.campaign('election', 'v1');
  const changes = reader(locks.observe('election'));
  assert.deepEqual(await changes.next(), { fence: a.fence, value: 'v1' });
  // Killed while idle, and a change made while it is disconnected.
  let [id] = await observerIds(server);
  assert.ok(id);
  await server.command('CLIENT', 'KILL', 'ID', id);
  await a.proclaim('v2');
  assert.deepEqual(await changes.next(), { fence: a.fence, value: 'v2' }, 'the change made meanwhile, once');
  assert.equal(await changes.next(500), NOTHING, 'no repeat');
  await eventually(async () => (await blockedClients(server)) === 1);
  // Killed while it waits in the server, and a change at once.
  [id] = await observerIds(server);
  await server.command('CLIENT', 'KILL', 'ID', id);
  assert.equal(await a.release(), true);
  assert.equal(await changes.next(), null, 'the resignation, once');
  assert.equal(await changes.next(500), NOTHING, 'no repeat');
  const b = await locks.campaign('election', 'v3');
  assert.deepEqual(await changes.next(), { fence: b.fence, value: 'v3' });
  await b.release();
  assert.equal(await changes.next(), null);
  await changes.return();
  await eventually(async () => (await observerIds(server)).length === 0);
});

test("ioredis's keyPrefix names every key the lock commands touch, as the client's own commands", async () => {
  const { default: Redis } = await import('ioredis');
  const server = await Server.start();
  const client = new Redis({ port: server.port, keyPrefix: 'app:' });
  const other = new Redis({ port: server.port, keyPrefix: 'app:' });
  const locks = new Locks(client);
  const rivals = new Locks(other);
  try {
    const lease = await locks.acquire('orders:1', 30_000);
    assert.ok(lease);
    assert.deepEqual(await server.command('KEYS', '*'), ['app:orders:1']);
    assert.equal(await rivals.acquire('orders:1', 30_000), null, 'the same lock through the same prefix');
    // A wait (its own connection, a duplicate of the client) names it too.
    const waiting = rivals.acquire('orders:1', 30_000, { timeoutMs: 10_000 });
    while ((await server.info('waiters')) !== 1) await sleep(10);
    // The command run under the lock: its keys as ioredis prefixes them.
    assert.equal(await lease.exec(['SET', 'stock', '5']), 'OK');
    assert.equal(await client.get('stock'), '5', 'written where the client reads');
    assert.equal(await lease.exec(['MSET', 'a', '1', Buffer.from('b'), '2']), 'OK');
    assert.deepEqual(await client.mget('a', 'b'), ['1', '2']);
    assert.equal(await lease.fenced('gate', ['INCR', 'count']), 1);
    assert.equal(await client.get('count'), '1');
    assert.equal(Number(await server.command('LOCK.FENCE', 'app:gate')), lease.fence, 'the gate is prefixed');
    assert.equal(await lease.release(), true);
    const second = await waiting;
    assert.ok(second.fence > lease.fence);
    assert.deepEqual((await server.command('KEYS', '*')).sort(), ['app:a', 'app:b', 'app:count', 'app:gate', 'app:orders:1', 'app:stock']);
    assert.equal(await second.fenced('gate', ['INCR', 'count']), 2);
    await assert.rejects(lease.fenced('gate', ['INCR', 'count']), StaleFenceError);
    assert.equal(await client.get('count'), '2', 'the stale write made nothing');
    await second.release();
    const both = await locks.acquireAll(['x', 'y'], 30_000);
    assert.deepEqual((await server.command('KEYS', 'app:[xy]')).sort(), ['app:x', 'app:y']);
    assert.equal(await both.release(), true);
    const lead = await locks.campaign('leader', 'v1', 30_000);
    assert.deepEqual(await rivals.leader('leader'), { fence: lead.fence, value: 'v1' });
    const changes = reader(rivals.observe('leader'));
    assert.deepEqual(await changes.next(), { fence: lead.fence, value: 'v1' });
    await lead.release();
    assert.equal(await changes.next(), null, 'observed through the prefix');
    await changes.return();
    assert.deepEqual(await server.command('KEYS', '*orders*'), [], 'nothing bare');
    assert.deepEqual(await server.command('KEYS', 'leader'), []);
  } finally {
    await locks.close();
    await rivals.close();
    client.disconnect();
    other.disconnect();
    await server.stop();
  }
});

test("ioredis's keyPrefix on a Cluster: the lock and its guarded write on the prefixed key's node", async () => {
  const { default: Redis } = await import('ioredis');
  const nodes = await startCluster();
  const client = new Redis.Cluster([{ host: '127.0.0.1', port: nodes[0].port }], { keyPrefix: '{t}' });
  const locks = new Locks(client);
  try {
    const lease = await locks.acquire('job', 30_000);
    assert.ok(lease);
    assert.equal(await lease.exec(['SET', 'data', 'x']), 'OK');
    assert.equal(await client.get('data'), 'x');
    const slot = Number(await nodes[0].command('CLUSTER', 'KEYSLOT', '{t}job'));
    const owner = nodes[[5460, 10922, 16383].findIndex((hi) => slot <= hi)];
    assert.equal(Number(await owner.command('LOCK.FENCE', '{t}job')), lease.fence);
    assert.equal(await owner.command('GET', '{t}data'), 'x');
    assert.equal(await lease.release(), true);
  } finally {
    await locks.close();
    client.disconnect();
    for (const s of nodes) await s.stop();
  }
});

for (const kind of CLIENTS) {
  test(`a client on another database waits in that database's line (${kind.name})`, async () => {
    const server = await Server.start();
    const client = await kind.open(server.port, undefined, 3);
    const locks = new Locks(client);
    try {
      const first = await locks.acquire('k', 30_000);
      assert.equal(await locks.acquire('k', 30_000, { timeoutMs: 300 }), null, "waited in db 3's line");
      const waiting = locks.acquire('k', 30_000, { timeoutMs: 10_000 });
      while ((await server.info('waiters')) !== 1) await sleep(10);
      assert.equal(await first.release(), true);
      const second = await waiting;
      assert.ok(second.fence > first.fence);
      assert.deepEqual(await server.command('KEYS', '*'), [], 'nothing in db 0');
      assert.equal(Number(await server.command('EVAL', "redis.call('SELECT', 3) return redis.call('LOCK.FENCE', 'k')", 0)), second.fence);
      assert.equal(await second.release(), true);
    } finally {
      await locks.close();
      await kind.close(client).catch(() => {});
      await server.stop();
    }
  });
}
