// redis-lock from Node.js with node-redis (npm install redis).
'use strict';
const { createClient } = require('redis');
const { randomUUID } = require('node:crypto');

const KEY = 'lock:report';

async function main() {
  const client = await createClient({ url: process.env.REDIS_URL }).connect();
  // A BLOCKed command holds its connection: wait on a duplicate of it.
  const waiter = await client.duplicate().connect();
  const [holder, next] = [randomUUID(), randomUUID()];

  // sendCommand takes strings; integer replies come back as numbers.
  const fence = await client.sendCommand(['LOCK.ACQUIRE', KEY, holder, '30000']);
  console.log('holder acquired: fence', fence);
  const info = await client.sendCommand(['LOCK.INFO', KEY]); // [field, value, ...]
  console.log('holder is', info[1] === holder ? 'the holder' : 'someone else');

  const waiting = waiter.sendCommand(['LOCK.ACQUIRE', KEY, next, '30000', 'BLOCK', '5000']);
  console.log('holder extends:', await client.sendCommand(['LOCK.EXTEND', KEY, holder, '30000']));
  console.log('holder releases:', await client.sendCommand(['LOCK.RELEASE', KEY, holder]));
  const nextFence = await waiting; // granted by the release (no polling, no gap)
  console.log('next acquired: fence', nextFence, nextFence > fence ? '(higher)' : '(NOT higher)');
  console.log('next releases:', await waiter.sendCommand(['LOCK.RELEASE', KEY, next]));
  await Promise.all([client.quit(), waiter.quit()]);
}

main().catch((err) => {
  console.error(err);
  process.exit(1);
});
