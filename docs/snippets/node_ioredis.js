// redis-lock from Node.js with ioredis (npm install ioredis).
// Fencing tokens are below 2^53, so ioredis' numbers hold them exactly.
'use strict';
const Redis = require('ioredis');
const { randomUUID } = require('node:crypto');

const url = process.env.REDIS_URL || 'redis://127.0.0.1:6379/0';
const KEY = 'lock:invoice:42';

// One connection per waiter: a BLOCKed command holds its connection, and
// ioredis queues other commands behind it. No command timeout by default;
// if you set commandTimeout, make it longer than the wait.
const acquire = (redis, token, ttlMs, waitMs) =>
  redis.call('LOCK.ACQUIRE', KEY, token, ttlMs, 'BLOCK', waitMs); // fence or null
const extend = async (redis, token, ttlMs) =>
  (await redis.call('LOCK.EXTEND', KEY, token, ttlMs)) === 1;
const release = async (redis, token) => (await redis.call('LOCK.RELEASE', KEY, token)) === 1;

// The protected resource keeps the highest fence that wrote to it.
const invoice = { status: 'new', fence: 0 };
function write(status, fence) {
  if (fence < invoice.fence) return false; // a later holder has written
  Object.assign(invoice, { status, fence });
  return true;
}

async function main() {
  const a = new Redis(url);
  const b = new Redis(url);
  const [tokenA, tokenB] = [randomUUID(), randomUUID()];

  const fenceA = await acquire(a, tokenA, 500, 5000);
  console.log('A acquired: fence', fenceA);
  console.log('A writes:', write('paid', fenceA));

  // A stalls past its 500 ms lease; B, waiting in line, gets the lock then.
  const fenceB = await acquire(b, tokenB, 3000, 5000);
  console.log('B acquired: fence', fenceB);
  console.log('B extends:', await extend(b, tokenB, 3000)); // renew: call every ttl/3
  console.log('B writes:', write('refunded', fenceB));

  console.log('A writes:', write('paid twice', fenceA)); // stale: refused
  console.log('A extends:', await extend(a, tokenA, 3000));
  console.log('A releases:', await release(a, tokenA));
  console.log('B releases:', await release(b, tokenB));
  console.log('invoice 42:', invoice.status, invoice.fence);
  await Promise.all([a.quit(), b.quit()]);
}

main().catch((err) => {
  console.error(err);
  process.exit(1);
});
