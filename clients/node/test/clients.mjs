// The clients every test runs with: ioredis, and node-redis over RESP2 and RESP3.
import Redis from 'ioredis';
import { createClient } from 'redis';

export const CLIENTS = [
  {
    name: 'ioredis',
    // `user`: { username, password } of an ACL user (its ready check runs
    // INFO, which such a user may not: skipped rather than logged); `db`:
    // the database, if not 0.
    async open(port, user, db = 0) {
      const auth = user ? { ...user, enableReadyCheck: false } : {};
      const c = new Redis(port, '127.0.0.1', { lazyConnect: true, db, ...auth });
      await c.connect();
      return c;
    },
    close: (c) => c.quit(),
  },
  nodeRedis('node-redis', {}),
  // node-redis 5 speaks RESP3 when asked: maps come back as objects.
  nodeRedis('node-redis RESP3', { RESP: 3 }),
];

/** node-redis, with `options` beside the URL. */
function nodeRedis(name, options) {
  return {
    name,
    async open(port, user, db = 0) {
      const auth = user ? `${user.username}:${user.password}@` : '';
      const c = createClient({ url: `redis://${auth}127.0.0.1:${port}`, database: db, ...options });
      c.on('error', () => {});
      await c.connect();
      return c;
    },
    close: (c) => (c.close ? c.close() : c.quit()),
  };
}
