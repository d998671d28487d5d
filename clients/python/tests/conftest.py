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


def free_port(cluster: bool = False) -> int:
    """A free port; for a cluster node one at most 55535 whose bus port
    (+10000) is free too."""
    if not cluster:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return s.getsockname()[1]
    import random

    for _ in range(1000):
        port = random.randint(20000, 55535)
        try:
            for p in (port, port + 10000):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", p))
            return port
        except OSError:
            continue
    raise RuntimeError("no free port pair for a cluster node")


class Server:
    """One redis-server on loopback; ``with_module=False`` for one without."""

    def __init__(self, with_module: bool = True, args: Optional[List[str]] = None) -> None:
        self.port = free_port(cluster="--cluster-enabled" in (args or []))
        self.dir = tempfile.mkdtemp(prefix="redis-lock-py-")
        cmd = [os.environ.get("REDIS_SERVER", "redis-server"), "--port", str(self.port),
               "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", self.dir,
               "--logfile", os.path.join(self.dir, "server.log"), "--enable-debug-command", "yes"]
        cmd += args or []
        if with_module:
            cmd += ["--loadmodule", module_path()]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 20
        while True:
            try:
                redis.Redis(port=self.port, socket_timeout=1).ping()
                break
            except redis.ConnectionError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"redis-server did not start: {self.log()}")
                time.sleep(0.02)

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
def plain_server() -> Iterator[Server]:
    s = Server(with_module=False)
    try:
        yield s
    finally:
        s.stop()


class Proxy:
    """A TCP proxy on 127.0.0.1 in front of ``upstream`` (a port), for a
    connection that goes quiet: :meth:`silence` keeps every connection it
    carries open but lets no byte through either way (a host gone, a NAT
    that forgot the flow: nothing is closed or reset); connections made
    after it pass. Plain threads; :meth:`close` closes everything."""

    def __init__(self, upstream: int) -> None:
        self.upstream = upstream
        self._listener = socket.socket()
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(64)
        self.port = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._conns: List[tuple] = []  # (client, upstream, quiet)
        threading.Thread(target=self._accept, daemon=True).start()

    def connections(self) -> int:
        """How many connections it has accepted."""
        with self._lock:
            return len(self._conns)

    def silence(self) -> None:
        with self._lock:
            for _, _, quiet in self._conns:
                quiet.set()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
                upstream = socket.create_connection(("127.0.0.1", self.upstream))
            except OSError:
                return
            quiet = threading.Event()
            with self._lock:
                self._conns.append((client, upstream, quiet))
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b, quiet), daemon=True).start()

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket, quiet: threading.Event) -> None:
        while True:
            try:
                data = src.recv(65536)
            except OSError:
                return
            if not data:
                try:
                    dst.shutdown(socket.SHUT_WR)
                except OSError:
                    pass
                return
            if quiet.is_set():
                continue  # lost on the way, for good
            try:
                dst.sendall(data)
            except OSError:
                return

    def close(self) -> None:
        self._listener.close()
        with self._lock:
            for client, upstream, _ in self._conns:
                client.close()
                upstream.close()
