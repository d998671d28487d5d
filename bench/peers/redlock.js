// node-redlock (npm `redlock` 4.x or 5.x beta over `ioredis`) driven for
// client/examples/redlock_bench.rs. One argument, JSON:
//   {"mode": "latency"|"contention"|"clockjump", "ports": [p1..p5], ...}
// prints one JSON object on stdout. Run by the Rust bench with NODE_PATH
// pointing at the install under target/bench-peers/node.
'use strict';

const Redis = require('ioredis');
const redlockModule = require('redlock');
// 4.x exports the class; 5.x (beta) exports it as `default` and changed the
// API: acquire([keys], ttl) / release(), attempts as a list, and using()
// with automatic extension and an AbortSignal.
const Redlock = redlockModule.default || redlockModule.Redlock || redlockModule;
// (5.x does not export its package.json: tell them apart by using().)
const V5 = typeof Redlock.prototype.using === 'function';
const lockOf = (redlock, key, ttl) => (V5 ? redlock.acquire([key], ttl) : redlock.lock(key, ttl));
const unlockOf = (lock) => (V5 ? lock.release() : lock.unlock());
const attemptsOf = (lock) => (V5 ? lock.attempts.length : lock.attempts);

const args = JSON.parse(process.argv[2]);
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const nowMs = () => Number(process.hrtime.bigint()) / 1e6;

function connect() {
  return args.ports.map((port) => new Redis({ host: '127.0.0.1', port, lazyConnect: false }));
}

function group(clients, retryCount) {
  // retryDelay ± retryJitter: uniform in [retryDelay - jitter, retryDelay + jitter].
  const half = args.retry_ms / 2;
  return new Redlock(clients, {
    driftFactor: 0.01,
    retryCount,
    retryDelay: half,
    retryJitter: half,
  });
}

async function ready(clients) {
  await Promise.all(clients.map((c) => c.ping()));
}

async function quit(clients) {
  await Promise.all(clients.map((c) => c.quit()));
}

async function latency() {
  const clients = connect();
  await ready(clients);
  const redlock = group(clients, 0);
  const key = args.key;
  const acquire = [];
  const release = [];
  for (let i = 0; i < args.warmup + args.iterations; i++) {
    const t0 = nowMs();
    const lock = await lockOf(redlock, key, args.ttl_ms);
    const t1 = nowMs();
    await unlockOf(lock);
    const t2 = nowMs();
    if (i >= args.warmup) {
      acquire.push(Math.round((t1 - t0) * 1000));
      release.push(Math.round((t2 - t1) * 1000));
    }
  }
  await quit(clients);
  return { acquire_us: acquire, release_us: release };
}

async function contention() {
  const n = args.clients;
  const groups = [];
  for (let i = 0; i < n; i++) {
    const clients = connect();
    await ready(clients);
    groups.push({ clients, redlock: group(clients, -1) });
  }
  const grants = new Array(n).fill(0);
  let holding = false;
  let overlaps = 0;
  let errors = 0;
  let heldMs = 0;
  let attempts = 0;
  const start = nowMs();
  const end = start + args.seconds * 1000;
  await Promise.all(
    groups.map(async (g, i) => {
      while (nowMs() < end) {
        if (V5) {
          // 5.x's using(): acquire, extend automatically, release.
          try {
            await g.redlock.using([args.key], args.ttl_ms, async () => {
              attempts++;
              if (holding) overlaps++;
              holding = true;
              const held = nowMs();
              await sleep(args.hold_ms);
              heldMs += nowMs() - held;
              holding = false;
              grants[i]++;
            });
          } catch (e) {
            errors++;
          }
          continue;
        }
        let lock;
        try {
          lock = await lockOf(g.redlock, args.key, args.ttl_ms);
        } catch (e) {
          errors++;
          continue;
        }
        attempts += attemptsOf(lock);
        if (holding) overlaps++;
        holding = true;
        const held = nowMs();
        await sleep(args.hold_ms);
        heldMs += nowMs() - held;
        holding = false;
        grants[i]++;
        try {
          await unlockOf(lock);
        } catch (e) {
          errors++;
        }
      }
    })
  );
  const elapsed = (nowMs() - start) / 1000;
  for (const g of groups) await quit(g.clients);
  const total = grants.reduce((a, b) => a + b, 0);
  return { grants, elapsed_s: elapsed, hold_ms: heldMs / Math.max(total, 1), attempts, overlaps, errors };
}

// Kleppmann's clock jump in its simplest faithful form (see the Rust side):
// D and E refuse client 1 (a placeholder holds them, standing for nodes
// client 1 could not reach), client 1 holds A, B, C; the placeholder goes,
// and the key on C is deleted as if C's clock had jumped past the lease;
// client 2 then takes C, D, E.
async function clockjump() {
  const raw = connect();
  await ready(raw);
  const key = args.key;
  const ttl = args.ttl_ms;
  for (const c of raw) await c.del(key);
  for (const c of raw.slice(3)) await c.set(key, 'placeholder', 'PX', ttl);
  const c1 = connect();
  const c2 = connect();
  await ready(c1);
  await ready(c2);
  const lock1 = await lockOf(group(c1, 0), key, ttl);
  const holders1 = [];
  for (const c of raw) holders1.push((await c.get(key)) === lock1.value);
  for (const c of raw.slice(3)) await c.del(key);
  await raw[2].del(key); // C's clock jumps: its copy of the lease is gone
  let lock2 = null;
  try {
    lock2 = await lockOf(group(c2, 0), key, ttl);
  } catch (e) {
    lock2 = null;
  }
  const client1Valid = lock1.expiration > Date.now();
  const overlap = lock2 !== null && client1Valid;
  if (lock2) await unlockOf(lock2).catch(() => {});
  await unlockOf(lock1).catch(() => {});
  await quit(raw);
  await quit(c1);
  await quit(c2);
  return {
    client1_nodes: holders1,
    client2_granted: lock2 !== null,
    client1_still_valid: client1Valid,
    overlap,
    // node-redlock gives no fencing token: a store cannot order the writes.
    stale_write_rejected: null,
  };
}

const modes = { latency, contention, clockjump };
modes[args.mode]()
  .then((out) => {
    process.stdout.write(JSON.stringify(out) + '\n');
    process.exit(0);
  })
  .catch((e) => {
    process.stderr.write(String(e && e.stack ? e.stack : e) + '\n');
    process.exit(1);
  });
