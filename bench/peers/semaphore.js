// npm `redis-semaphore` (Semaphore, Mutex, MultiSemaphore over `ioredis`)
// driven for section 8 of examples/bench (examples/bench/semaphore.rs). One
// argument, JSON:
//   {"port": P, "kind": "semaphore"|"mutex"|"multisemaphore", "clients": 16,
//    "limit": 4, "hold_ms": 2, "seconds": S}
// prints one JSON object on stdout. Run by the Rust bench with NODE_PATH
// pointing at the install under target/bench-peers/semaphore.
//
// Each client is its own ioredis connection in this one process and loops:
// a fresh lock object (a fresh random identifier, as a new permit) →
// acquire() (its wait measured from the call to the grant) → hold
// (setTimeout) → release(). The library's default acquire options are kept
// (retryInterval 10 ms, unlimited attempts), except acquireTimeout and
// lockTimeout, both given as 10 s (their defaults too, in 5.8.0).
'use strict';

const { setMaxListeners } = require('events');
const Redis = require('ioredis');
const { Semaphore, Mutex, MultiSemaphore, defaultTimeoutOptions } = require('redis-semaphore');

const args = JSON.parse(process.argv[2]);
const clients = args.clients || 16;
const limit = args.kind === 'mutex' ? 1 : args.limit || 4;
const holdMs = args.hold_ms === undefined ? 2 : args.hold_ms;
const key = args.key || 'sem';
const options = { acquireTimeout: 10000, lockTimeout: 10000 };
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const nowMs = () => Number(process.hrtime.bigint()) / 1e6;

function lockOf(client) {
  switch (args.kind) {
    case 'semaphore':
      return new Semaphore(client, key, limit, options);
    case 'mutex':
      return new Mutex(client, key, options);
    case 'multisemaphore':
      // One permit of `limit`: comparable with a semaphore of `limit`.
      return new MultiSemaphore(client, key, limit, 1, options);
    default:
      throw new Error(`unknown kind ${args.kind}`);
  }
}

async function main() {
  const conns = [];
  const sent = new Array(clients).fill(0);
  for (let i = 0; i < clients; i++) {
    const c = new Redis({ host: '127.0.0.1', port: args.port });
    await c.ping();
    // Every command a client sends goes through sendCommand: count them.
    const send = c.sendCommand;
    c.sendCommand = function (command, stream) {
      sent[i]++;
      return send.call(this, command, stream);
    };
    conns.push(c);
  }
  sent.fill(0);
  const grants = new Array(clients).fill(0);
  const timeouts = new Array(clients).fill(0);
  const waits = [];
  let holders = 0;
  let maxHolders = 0;
  let overLimit = 0;
  let errors = 0;
  let firstError = null;
  const stop = new AbortController();
  // Every waiting acquire listens on it.
  setMaxListeners(clients * 2 + 10, stop.signal);
  const start = nowMs();
  const timer = setTimeout(() => stop.abort(), args.seconds * 1000);
  await Promise.all(
    conns.map(async (client, i) => {
      while (!stop.signal.aborted) {
        const lock = lockOf(client);
        const asked = nowMs();
        try {
          await lock.acquire(stop.signal);
        } catch (e) {
          if (stop.signal.aborted) break;
          if (e && e.name === 'TimeoutError') timeouts[i]++;
          else {
            errors++;
            firstError = firstError || String(e && e.stack ? e.stack : e);
          }
          continue;
        }
        waits.push(Math.round((nowMs() - asked) * 1000));
        // Counted from the clients' side: after the grant, before the
        // release is sent.
        if (holders >= limit) overLimit++;
        holders++;
        if (holders > maxHolders) maxHolders = holders;
        await sleep(holdMs);
        holders--;
        await lock.release();
        grants[i]++;
      }
    })
  );
  clearTimeout(timer);
  const elapsed = (nowMs() - start) / 1000;
  const commands = sent.reduce((a, b) => a + b, 0);
  await Promise.all(conns.map((c) => c.quit()));
  return {
    grants: grants.reduce((a, b) => a + b, 0),
    seconds: elapsed,
    per_client: grants,
    timeouts: timeouts.reduce((a, b) => a + b, 0),
    max_holders: maxHolders,
    over_limit: overLimit,
    client_commands: commands,
    errors,
    first_error: firstError,
    retry_interval_ms: defaultTimeoutOptions.retryInterval,
    waits_us: waits,
  };
}

main()
  .then((out) => {
    // stdout to a pipe is asynchronous: exit once the reply is written.
    process.stdout.write(JSON.stringify(out) + '\n', () => process.exit(0));
  })
  .catch((e) => {
    process.stderr.write(String(e && e.stack ? e.stack : e) + '\n');
    process.exit(1);
  });
