// Contention on one key from Node.js, for section 10 of examples/bench
// (examples/bench/clients.rs): N clients in this process, each its own
// ioredis connection, loop acquire (its wait measured from the call to the
// grant) -> hold -> release, for S seconds. One argument, JSON:
//   {"port": P, "lib": "this"|"redlock"|"sesamecare-redlock"|"redis-semaphore",
//    "clients": 16, "hold_ms": 2, "seconds": S, "package": path of clients/node}
// prints one JSON object: grants, seconds, waits_us, per_client, errors.
// Run with NODE_PATH at the peers' install. Each library keeps its defaults
// for how it waits, except that every one may wait up to 10 s.
'use strict';

const Redis = require('ioredis');

const args = JSON.parse(process.argv[2]);
const clients = args.clients || 16;
const holdMs = args.hold_ms === undefined ? 2 : args.hold_ms;
const key = 'bench:contended';
const TTL = 10000;
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const nowMs = () => Number(process.hrtime.bigint()) / 1e6;

function lockOf(client) {
  switch (args.lib) {
    case 'this': {
      const { Locks } = require(args.package);
      const locks = new Locks(client, { renew: false });
      return { acquire: () => locks.acquire(key, TTL, { timeoutMs: 10000 }), release: (l) => l.release() };
    }
    case 'redlock': {
      const Redlock = require('redlock');
      const redlock = new Redlock([client], { retryCount: 1000 });
      return { acquire: () => redlock.lock(key, TTL), release: (l) => l.unlock() };
    }
    case 'sesamecare-redlock': {
      const { Redlock } = require('@sesamecare-oss/redlock');
      const redlock = new Redlock([client], { retryCount: 1000 });
      return { acquire: () => redlock.acquire([key], TTL), release: (l) => l.release() };
    }
    case 'redis-semaphore': {
      const { Mutex } = require('redis-semaphore');
      return {
        acquire: async () => {
          const m = new Mutex(client, key, { acquireTimeout: 10000, lockTimeout: TTL });
          await m.acquire();
          return m;
        },
        release: (m) => m.release(),
      };
    }
    default:
      throw new Error(`unknown lib ${args.lib}`);
  }
}

async function main() {
  const waits = [];
  const perClient = new Array(clients).fill(0);
  const errors = [];
  let stop = false;
  const conns = await Promise.all(
    Array.from({ length: clients }, async () => {
      const c = new Redis(args.port, '127.0.0.1', { lazyConnect: true, maxRetriesPerRequest: 0 });
      await c.connect();
      return c;
    }),
  );
  const worker = async (i) => {
    const { acquire, release } = lockOf(conns[i]);
    while (!stop) {
      const start = nowMs();
      let handle;
      try {
        handle = await acquire();
      } catch (e) {
        errors.push(String(e));
        continue;
      }
      const waited = nowMs() - start;
      if (!handle) continue;
      await sleep(holdMs);
      try {
        await release(handle);
      } catch (e) {
        errors.push(String(e));
      }
      waits.push(Math.round(waited * 1000));
      perClient[i] += 1;
    }
  };
  const started = nowMs();
  const running = conns.map((_, i) => worker(i));
  await sleep(args.seconds * 1000);
  stop = true;
  await Promise.all(running);
  const seconds = (nowMs() - started) / 1000;
  await Promise.all(conns.map((c) => c.quit().catch(() => {})));
  process.stdout.write(
    JSON.stringify({ grants: perClient.reduce((a, b) => a + b, 0), seconds, waits_us: waits, per_client: perClient,
      errors: errors.length, first_error: errors[0] ?? null }) + '\n',
  );
  process.exit(0);
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
