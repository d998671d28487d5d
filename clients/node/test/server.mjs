// Real servers for the tests: redis-server (REDIS_SERVER, default
// redis-server) with the module (REDIS_LOCK_MODULE, default the workspace's
// release build) on a free 127.0.0.1 port, started by the test and
// stopped by PID.
import { spawn } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { createServer, connect } from 'node:net';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

const root = join(dirname(fileURLToPath(import.meta.url)), '../../..');
export const modulePath = () => process.env.REDIS_LOCK_MODULE || join(root, 'target/release/libredis_lock.so');

const freePort = () =>
  new Promise((resolve, reject) => {
    const s = createServer();
    s.listen(0, '127.0.0.1', () => {
      const { port } = s.address();
      s.close(() => resolve(port));
    });
    s.on('error', reject);
  });

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

/** A raw RESP2 round trip on a fresh socket: the reply's first line. */
export function raw(port, args) {
  return new Promise((resolve, reject) => {
    const sock = connect(port, '127.0.0.1');
    let buf = '';
    sock.on('data', (d) => {
      buf += d.toString('latin1');
      const reply = parse(buf);
      if (reply !== undefined) {
        sock.end();
        resolve(reply.value);
      }
    });
    sock.on('error', reject);
    sock.write(`*${args.length}\r\n` + args.map((a) => `$${Buffer.byteLength(String(a))}\r\n${a}\r\n`).join(''));
  });
}

/** Parses one RESP2 reply from `s`: { value, rest } or undefined if short. */
function parse(s) {
  const end = s.indexOf('\r\n');
  if (end < 0) return undefined;
  const line = s.slice(1, end);
  const rest = s.slice(end + 2);
  switch (s[0]) {
    case '+': return { value: line, rest };
    case '-': return { value: new Error(line), rest };
    case ':': return { value: Number(line), rest };
    case '$': {
      const n = Number(line);
      if (n < 0) return { value: null, rest };
      if (rest.length < n + 2) return undefined;
      return { value: rest.slice(0, n), rest: rest.slice(n + 2) };
    }
    case '*': {
      const n = Number(line);
      if (n < 0) return { value: null, rest };
      const out = [];
      let r = rest;
      for (let i = 0; i < n; i++) {
        const p = parse(r);
        if (!p) return undefined;
        out.push(p.value);
        r = p.rest;
      }
      return { value: out, rest: r };
    }
    default: return undefined;
  }
}

export class Server {
  static async start({ module = true, args = [] } = {}) {
    const s = new Server();
    s.dir = mkdtempSync(join(tmpdir(), 'redis-lock-node-'));
    const cluster = args.includes('--cluster-enabled');
    // A port chosen free can be taken before the server binds it (by a
    // server another test starts): a server that exits gets new ports.
    for (let attempt = 0; ; attempt++) {
      s.port = await freePort();
      s.busPort = cluster ? await freePort() : undefined;
      const extra = cluster ? ['--cluster-port', String(s.busPort)] : [];
      const argv = ['--port', String(s.port), '--bind', '127.0.0.1', '--save', '', '--appendonly', 'no',
        '--dir', s.dir, '--logfile', join(s.dir, 'server.log'), ...extra, ...args];
      if (module) argv.push('--loadmodule', modulePath());
      s.proc = spawn(process.env.REDIS_SERVER || 'redis-server', argv, { stdio: 'ignore' });
      if (await s.#ready()) return s;
      if (s.proc.exitCode === null || attempt === 2) {
        const log = s.log();
        await s.stop();
        throw new Error(`redis-server did not start: ${log}`);
      }
    }
  }

  /** Whether the server answers; false as soon as it has exited. */
  async #ready() {
    const deadline = Date.now() + 20000;
    while (Date.now() < deadline) {
      try {
        if ((await raw(this.port, ['PING'])) === 'PONG') return true;
      } catch {
        // not up yet
      }
      if (this.proc.exitCode !== null) return false;
      await sleep(20);
    }
    return false;
  }

  get url() {
    return `redis://127.0.0.1:${this.port}`;
  }

  log() {
    try {
      return readFileSync(join(this.dir, 'server.log'), 'utf8');
    } catch {
      return '';
    }
  }

  /** A field of INFO lock (`lock_<field>`). */
  async info(field) {
    const text = await raw(this.port, ['INFO', 'lock']);
    const line = text.split('\r\n').find((l) => l.startsWith(`lock_${field}:`));
    if (!line) throw new Error(`no lock_${field}`);
    return Number(line.split(':')[1]);
  }

  command(...args) {
    return raw(this.port, args);
  }

  async stop() {
    if (this.proc.exitCode === null) {
      const exited = new Promise((r) => this.proc.once('exit', r));
      this.proc.kill('SIGKILL');
      await exited;
    }
    rmSync(this.dir, { recursive: true, force: true });
  }
}

/** A TCP proxy on 127.0.0.1 in front of `upstream` (a port), for a
 * connection that goes quiet: `silence()` keeps every connection it
 * carries open but lets no byte through either way (a host gone, a NAT
 * that forgot the flow: nothing is closed or reset); connections made
 * after it pass. `close()` ends everything. */
export class Proxy {
  static start(upstream) {
    const proxy = new Proxy();
    proxy.pairs = [];
    proxy.server = createServer((client) => {
      const up = connect(upstream, '127.0.0.1');
      const pair = { client, up, quiet: false };
      proxy.pairs.push(pair);
      client.on('data', (d) => pair.quiet || up.write(d));
      up.on('data', (d) => pair.quiet || client.write(d));
      for (const [a, b] of [[client, up], [up, client]]) {
        a.on('end', () => b.end());
        a.on('error', () => b.destroy());
      }
    });
    return new Promise((resolve, reject) => {
      proxy.server.listen(0, '127.0.0.1', () => {
        proxy.port = proxy.server.address().port;
        resolve(proxy);
      });
      proxy.server.on('error', reject);
    });
  }

  /** How many connections it has accepted. */
  get connections() {
    return this.pairs.length;
  }

  silence() {
    for (const pair of this.pairs) pair.quiet = true;
  }

  close() {
    for (const { client, up } of this.pairs) {
      client.destroy();
      up.destroy();
    }
    return new Promise((resolve) => this.server.close(() => resolve()));
  }
}
