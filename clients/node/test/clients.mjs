// The two clients every test runs with: ioredis and node-redis.
import Redis from 'ioredis';
import { createClient } from 'redis';

export const CLIENTS = [
  {
    name: 'ioredis',
    async open(port) {
      const c = new Redis(port, '127.0.0.1', { lazyConnect: true });
      await c.connect();
      return c;
    },
    close: (c) => c.quit(),
  },
  {
    name: 'node-redis',
    async open(port) {
      const c = createClient({ url: `redis://127.0.0.1:${port}` });
      c.on('error', () => {});
      await c.connect();
      return c;
    },
    close: (c) => (c.close ? c.close() : c.quit()),
  },
];
