"""Real servers for the tests: redis-server (``REDIS_SERVER``, default
``redis-server``) with the module (``REDIS_LOCK_MODULE``, default the
workspace's release build) on a free 127.0.0.1 port, started by the test
and stopped by PID."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Iterator, List, Optional

import pytest
import redis

ROOT = Path(__file__).resolve().parents[3]


def module_path() -> str:
    return os.environ.get("REDIS_LOCK_MODULE") or str(ROOT / "target/release/libredis_lock.so")


def free_port() -> int:
    """A port of 127.0.0.1 free when asked (see ``Server`` for the race)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


#: An ACL user's rules with the lock commands alone (no INFO, no CLIENT).
LOCK_ONLY_USER = ["~app:*", "+lock.acquire", "+lock.release", "+lock.extend", "+lock.info",
                  "+lock.fence", "+lock.acquireall", "+lock.releaseall", "+lock.observe"]


class Server:
    """One redis-server on loopback; ``with_module=False`` for one without."""

    def __init__(self, with_module: bool = True, args: Optional[List[str]] = None) -> None:
        self.dir = tempfile.mkdtemp(prefix="redis-lock-py-")
        cluster = "--cluster-enabled" in (args or [])
        # A port chosen free can be taken before the server binds it (by a
        # server another test starts): a server that exits gets new ports.
        for attempt in range(3):
            self.port = free_port()
            # A cluster node's bus port is its own, not port + 10000 (which
            # may be past 65535 or taken).
            self.bus_port = free_port() if cluster else None
            cmd = [os.environ.get("REDIS_SERVER", "redis-server"), "--port", str(self.port),
                   "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", self.dir,
                   "--logfile", os.path.join(self.dir, "server.log"),
                   "--enable-debug-command", "yes"]
            if cluster:
                cmd += ["--cluster-port", str(self.bus_port)]
            cmd += args or []
            if with_module:
                cmd += ["--loadmodule", module_path()]
            self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            if self._wait_ready():
                return
            if self.proc.poll() is None or attempt == 2:
                log = self.log()
                self.stop()
                raise RuntimeError(f"redis-server did not start: {log}")

    def _wait_ready(self) -> bool:
        """Whether the server answers; False as soon as it has exited."""
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                redis.Redis(port=self.port, socket_timeout=1).ping()
                return True
            except redis.ConnectionError:
                if self.proc.poll() is not None:
                    return False
                time.sleep(0.02)
        return False

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def client(self, **kwargs) -> redis.Redis:
        return redis.Redis(port=self.port, **kwargs)

    def log(self) -> str:
        try:
            return Path(self.dir, "server.log").read_text()
        except OSError:
            return ""

    def info(self, field: str) -> int:
        """A field of INFO lock (``lock_<field>``)."""
        with redis.Redis(port=self.port) as r:
            return int(r.info("lock")[f"lock_{field}"])

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture
def server() -> Iterator[Server]:
    s = Server()
    try:
        yield s
    finally:
        s.stop()


@pytest.fixture
def cluster() -> Iterator[List[Server]]:
    """Three masters on loopback, slots split between them, the cluster
    ready on each."""
    nodes = [Server(args=["--cluster-enabled", "yes", "--cluster-node-timeout", "5000"])
             for _ in range(3)]
    try:
        ranges = [(0, 5460), (5461, 10922), (10923, 16383)]
        for node, (lo, hi) in zip(nodes, ranges):
            redis.Redis(port=node.port).execute_command("CLUSTER", "ADDSLOTSRANGE", lo, hi)
        first = redis.Redis(port=nodes[0].port)
        for node in nodes[1:]:
            first.execute_command("CLUSTER", "MEET", "127.0.0.1", node.port, node.bus_port)
        deadline = time.monotonic() + 20
        for node in nodes:
            r = redis.Redis(port=node.port)
            while (b"cluster_state:ok" not in r.execute_command("CLUSTER", "INFO")
                   or len(r.execute_command("CLUSTER", "SLOTS")) < 3):
                assert time.monotonic() < deadline, "the cluster did not come up"
                time.sleep(0.05)
        yield nodes
    finally:
        for node in nodes:
            node.stop()


def keys_on_each_node(rc, nodes, prefix):
    """A key for each node of the cluster (by the port that serves its
    slot), in the order of ``nodes``."""
    found = {}
    i = 0
    while len(found) < len(nodes):
        key = f"{prefix}:{i}"
        found.setdefault(rc.get_node_from_key(key).port, key)
        i += 1
    return [found[n.port] for n in nodes]


@pytest.fixture
def plain_server() -> Iterator[Server]:
    s = Server(with_module=False)
    try:
        yield s
    finally:
        s.stop()



class Stall:
    """A TCP relay to a server on loopback that can be made to hang: once
    stalled it forwards nothing either way and accepts no connection (the
    kernel still completes the handshake, so a connect succeeds and the
    reply never comes), as a server behind a broken network does. Once
    silenced, the connections it carries then go quiet for good (open,
    nothing closed or reset: a host gone, a NAT that forgot the flow) while
    new ones pass. Closed: every connection ends."""

    def __init__(self, port: int) -> None:
        self.target = port
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(64)
        self.port = self.listener.getsockname()[1]
        self.flowing = threading.Event()
        self.flowing.set()
        self.closed = False
        self.socks: List[socket.socket] = []
        # One per connection accepted: set, its bytes go nowhere.
        self.quiet: List[threading.Event] = []
        self.guard = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            self.flowing.wait()
            try:
                near, _ = self.listener.accept()
            except OSError:
                return
            try:
                far = socket.create_connection(("127.0.0.1", self.target))
            except OSError:
                near.close()
                continue
            quiet = threading.Event()
            with self.guard:
                self.socks += [near, far]
                self.quiet.append(quiet)
            for src, dst in ((near, far), (far, near)):
                threading.Thread(target=self._pump, args=(src, dst, quiet), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, quiet: threading.Event) -> None:
        while True:
            try:
                data = src.recv(65536)
            except OSError:
                break
            if not data:
                break
            self.flowing.wait()  # stalled: the bytes go nowhere
            if self.closed:
                break
            if quiet.is_set():
                continue  # silenced: lost on the way, for good
            try:
                dst.sendall(data)
            except OSError:
                break
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def stall(self) -> None:
        self.flowing.clear()

    def silence(self) -> None:
        with self.guard:
            for quiet in self.quiet:
                quiet.set()

    def connections(self) -> int:
        """How many connections it has accepted."""
        with self.guard:
            return len(self.quiet)

    def close(self) -> None:
        self.closed = True
        self.listener.close()
        with self.guard:
            for s in self.socks:
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                s.close()
        self.flowing.set()


# PY_PROTOCOL=2: every client the tests make speaks RESP2, the default of
# redis-py before 8 (8 speaks RESP3), where replies come as flat arrays
# instead of maps. make test runs the conformance suite so once more.
if os.environ.get("PY_PROTOCOL") == "2":
    import redis.asyncio as _aredis

    for _cls in (redis.Redis, _aredis.Redis, redis.RedisCluster, _aredis.RedisCluster):
        def _resp2(self, *args, __init=_cls.__init__, **kwargs):
            kwargs.setdefault("protocol", 2)
            __init(self, *args, **kwargs)

        _cls.__init__ = _resp2
