// The shared conformance suite (clients/conformance/scenarios.json), run over
// ioredis and node-redis. The Rust and Python clients run the same file; a
// client that differs fails.
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { test } from 'node:test';
import { fileURLToPath } from 'node:url';

import { Locks, ModuleMissingError, NotAcquiredError, NotHeldError, StaleFenceError } from 'redis-lock-client';

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

/** A campaign's outcome as an acquire's: { lease } (null: not granted in
 * time) or { error }. */
async function campaign(l, step, signal) {
  try {
    return { lease: await l.campaign(step.key, step.value, { ttlMs: step.ttl_ms, timeoutMs: step.timeout_ms ?? 0, signal }) };
  } catch (e) {
    return e instanceof NotAcquiredError ? { lease: null } : { error: e };
  }
}

/** An observer's items, read as they come: `next(ms)` is the next one, or
 * NOTHING if none comes within ms. */
const NOTHING = Symbol('nothing');
function pump(iterable) {
  const items = [];
  let wake;
  (async () => {
    try {
      for await (const item of iterable) {
        items.push({ item });
        wake?.();
      }
    } catch (error) {
      items.push({ error });
      wake?.();
    }
  })();
  return {
    async next(ms) {
      const deadline = Date.now() + ms;
      while (items.length === 0 && Date.now() < deadline) {
        await new Promise((r) => {
          wake = r;
          setTimeout(r, deadline - Date.now());
        });
      }
      if (items.length === 0) return NOTHING;
      const { item, error } = items.shift();
      if (error) throw error;
      return item;
    },
  };
}

async function run(scenario, kind) {
  const server = await Server.start({ module: scenario.server !== 'plain' });
  const client = await kind.open(server.port);
  const locks = { renew: new Locks(client, { renew: true }), still: new Locks(client, { renew: false }) };
  const leases = {};
  const campaigns = {};
  const observers = {};
  const stop = new AbortController();
  const where = (i, step) => `${scenario.name}, step ${i} ${JSON.stringify(step)}`;
  const judgeAcquire = (i, step, { lease, error }) => {
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
  };
  const judgeLeader = (i, step, got) => {
    const want = step.expect === 'vacant' ? null : { fence: leases[step.expect.fence_of].fence, value: step.expect.value };
    assert.deepEqual(got === null ? null : { fence: got.fence, value: got.value }, want, where(i, step));
  };
  try {
    for (const [i, step] of scenario.steps.entries()) {
      switch (step.do) {
        case 'campaign': {
          const l = locks[step.renew === false ? 'still' : 'renew'];
          if (step.background) campaigns[step.as] = campaign(l, step, stop.signal);
          else judgeAcquire(i, step, await campaign(l, step));
          break;
        }
        case 'campaigned': {
          const outcome = await Promise.race([
            campaigns[step.as],
            sleep(step.within_ms).then(() => assert.fail(`${where(i, step)}: the campaign did not end in time`)),
          ]);
          delete campaigns[step.as];
          judgeAcquire(i, step, outcome);
          break;
        }
        case 'proclaim': {
          let error;
          try {
            await leases[step.as].proclaim(step.value);
          } catch (e) {
            error = e;
          }
          if (step.expect_error) assert.equal(errorName(error), step.expect_error, `${where(i, step)}: ${error}`);
          else if (error) throw error;
          break;
        }
        case 'leader':
          judgeLeader(i, step, await locks.renew.leader(step.key));
          break;
        case 'observe':
          observers[step.as] = pump(locks.renew.observe(step.key, { signal: stop.signal }));
          break;
        case 'observed': {
          const got = await observers[step.as].next(step.within_ms);
          if (step.expect === 'nothing') assert.equal(got, NOTHING, `${where(i, step)}: got ${JSON.stringify(got)}`);
          else {
            assert.notEqual(got, NOTHING, `${where(i, step)}: nothing came`);
            judgeLeader(i, step, got);
          }
          break;
        }
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
    stop.abort();
    await Promise.allSettled(Object.values(campaigns));
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
