// Redlock over independent redis-lock nodes from Node.js (ioredis), with one
// fencing token for the whole group (quorum fencing): the steps the Rust
// client and the redis-lock command take, minus their FIFO waiting line.
'use strict';
const Redis = require('ioredis');
const { randomBytes } = require('node:crypto');

const nodes = (process.env.REDIS_URLS || 'redis://127.0.0.1:6379/').split(',').map((u) => new Redis(u));
const quorum = Math.floor(nodes.length / 2) + 1;

// One command on each of `targets` in parallel; an error or a late reply is null.
function onAll(targets, args, timeoutMs) {
  return Promise.all(
    targets.map((node) => {
      let timer;
      const late = new Promise((resolve) => (timer = setTimeout(resolve, timeoutMs, null)));
      const reply = node.call(...args).catch(() => null);
      return Promise.race([reply, late]).finally(() => clearTimeout(timer));
    }),
  );
}

async function acquire(key, ttlMs) {
  const token = randomBytes(16).toString('hex');
  const start = Date.now();
  const timeoutMs = Math.min(500, Math.max(5, ttlMs / 10));
  const validUntil = start + ttlMs - (ttlMs / 100 + 2); // TTL minus the clock drift allowance

  // 1. The same token and TTL on every node; T = the largest token granted.
  const tokens = await onAll(nodes, ['LOCK.ACQUIRE', key, token, ttlMs], timeoutMs);
  let granted = nodes.filter((_, i) => tokens[i] !== null);
  const fence = Math.max(0, ...tokens.filter((t) => t !== null));

  // 2. If the granting nodes disagree, raise them all to T: each node's
  //    later grants are then above T, and any two majorities share a node.
  if (granted.length >= quorum && tokens.some((t) => t !== null && t !== fence)) {
    const raised = await onAll(granted, ['LOCK.ACQUIRE', key, token, ttlMs, 'MINFENCE', fence], timeoutMs);
    granted = granted.filter((_, i) => raised[i] === fence);
  }

  // 3. Held if a majority confirmed T within the validity; else undo everywhere.
  if (granted.length >= quorum && Date.now() < validUntil) {
    return { key, token, ttlMs, fence, validUntil, nodes: granted.length };
  }
  await onAll(nodes, ['LOCK.RELEASE', key, token], timeoutMs);
  return null;
}

async function extend(lock) {
  const start = Date.now();
  const replies = await onAll(nodes, ['LOCK.EXTEND', lock.key, lock.token, lock.ttlMs], 500);
  const validUntil = start + lock.ttlMs - (lock.ttlMs / 100 + 2);
  if (replies.filter((r) => r === 1).length < quorum || Date.now() >= validUntil) return false;
  lock.validUntil = validUntil;
  return true;
}

async function release(lock) {
  const replies = await onAll(nodes, ['LOCK.RELEASE', lock.key, lock.token], 500);
  return replies.filter((r) => r === 1).length >= quorum;
}

async function main() {
  const a = await acquire('invoice:42', 10000);
  console.log(`A acquired on ${a.nodes} of ${nodes.length} nodes: fence ${a.fence}`);
  const fences = await Promise.all(nodes.map((n) => n.call('LOCK.FENCE', 'invoice:42')));
  console.log('every node has fence', fences.every((f) => f === a.fence) ? a.fence : fences.join(','));
  console.log('B acquired:', (await acquire('invoice:42', 10000)) !== null);
  console.log('A extends:', await extend(a));
  console.log('A releases:', await release(a));
  const c = await acquire('invoice:42', 10000);
  console.log(`C acquired: fence ${c.fence}`, c.fence > a.fence ? "(above A's)" : "(NOT above A's)");
  console.log('C releases:', await release(c));
  nodes.forEach((n) => n.disconnect());
}

main().catch((err) => {
  console.error(err);
  process.exit(1);
});
