// The shared conformance suite (clients/conformance/scenarios.json), run over
// ioredis and node-redis. The Rust and Python clients run the same file; a
// client that differs fails.
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { test } from 'node:test';
import { fileURLToPath } from 'node:url';

import { Locks, ModuleMissingError, NotHeldError, StaleFenceError } from 'redis-lock-client';

import { CLIENTS } from './clients.mjs';
import { Server } from './server.mjs';

const here = dirname(fileURLToPath(import.meta.url));
const { scenarios } = JSON.parse(readFileSync(join(here, '../../conformance/scenarios.json'), 'utf8'));
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

function errorName(e) {
  if (e instanceof NotHeldError) return 'NotHeld';
  if (e instanceof StaleFenceError) return 'StaleFence';
  if (e instanceof ModuleMissingError) return 'ModuleMissing';
  if (e instanceof Error && !(e instanceof RangeError) && !(e instanceof TypeError)) return 'ServerError';
  return String(e);
}

async function run(scenario, kind) {
  const server = await Server.start({ module: scenario.server !== 'plain' });
  const client = await kind.open(server.port);
  const locks = { renew: new Locks(client, { renew: true }), still: new Locks(client, { renew: false }) };
  const leases = {};
  const where = (i, step) => `${scenario.name}, step ${i} ${JSON.stringify(step)}`;
  try {
    for (const [i, step] of scenario.steps.entries()) {
      switch (step.do) {
        case 'acquire': {
          const l = locks[step.renew === false ? 'still' : 'renew'];
          const options = {
            timeoutMs: step.timeout_ms ?? 0,
            shared: step.shared ?? false,
            limit: step.limit ?? undefined,
            token: step.token_of ? leases[step.token_of].token : undefined,
          };
          let lease;
          let error;
          try {
            lease = step.keys ? await l.acquireAll(step.keys, step.ttl_ms, options) : await l.acquire(step.key, step.ttl_ms, options);
          } catch (e) {
            error = e;
          }
          if (step.expect_error) {
            assert.ok(error, where(i, step));
            assert.equal(errorName(error), step.expect_error, `${where(i, step)}: ${error}`);
          } else {
            if (error) throw error;
            if (step.expect === 'granted') {
              assert.ok(lease, where(i, step));
              leases[step.as] = lease;
            } else assert.equal(lease, null, where(i, step));
          }
          break;
        }
        case 'release':
          assert.equal(await leases[step.lease].release(), step.expect, where(i, step));
          break;
        case 'exec':
        case 'fenced': {
          const lease = leases[step.lease];
          let got;
          let error;
          try {
            got = step.do === 'exec' ? await lease.exec(step.command) : await lease.fenced(step.gate, step.command);
          } catch (e) {
            error = e;
          }
          if (step.expect_error) assert.equal(errorName(error), step.expect_error, `${where(i, step)}: ${error}`);
          else {
            if (error) throw error;
            assert.equal(got, step.expect, where(i, step));
          }
          break;
        }
        case 'sleep_ms':
          await sleep(step.ms);
          break;
        case 'wait_lost': {
          const { signal } = leases[step.lease];
          if (!signal.aborted) {
            await Promise.race([
              new Promise((r) => signal.addEventListener('abort', r, { once: true })),
              sleep(step.within_ms).then(() => assert.fail(`${where(i, step)}: not lost in time`)),
            ]);
          }
          break;
        }
        case 'expect_valid':
          assert.equal(leases[step.lease].isValid(), step.valid, where(i, step));
          break;
        case 'fence_order':
          assert.ok(leases[step.later].fence > leases[step.earlier].fence, where(i, step));
          break;
        case 'same_fence':
          assert.equal(leases[step.a].fence, leases[step.b].fence, where(i, step));
          break;
        case 'cancelled_wait': {
          const controller = new AbortController();
          const waiting = locks.renew.acquire(step.key, step.ttl_ms, { timeoutMs: 30_000, signal: controller.signal });
          await sleep(step.cancel_after_ms);
          controller.abort();
          await assert.rejects(waiting, (e) => e?.name === 'AbortError', where(i, step));
          break;
        }
        case 'server': {
          const got = await server.command(...step.command);
          if (step.expect_fence_of) assert.equal(got, leases[step.expect_fence_of].fence, where(i, step));
          else assert.equal(got, step.expect, where(i, step));
          break;
        }
        case 'server_info':
          assert.equal(await server.info(step.field), step.expect, where(i, step));
          break;
        default:
          assert.fail(`unknown step ${step.do}`);
      }
    }
  } finally {
    await locks.renew.close();
    await locks.still.close();
    await kind.close(client).catch(() => {});
    await server.stop();
  }
}

for (const kind of CLIENTS) {
  for (const scenario of scenarios) {
    test(`${scenario.name} (${kind.name})`, () => run(scenario, kind));
  }
}
