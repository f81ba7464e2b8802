"""A real Redis Cluster for a test: redis-server processes on free loopback ports, formed with
``redis-cli --cluster create`` (Debian's redis-server and redis-tools, installed by
tools/install-deps.sh). Each node runs in its own temporary folder with persistence off, and dies
with the test process (PR_SET_PDEATHSIG) or at ``stop()``.

    with RedisCluster(masters=3) as cluster:
        url = cluster.url          # redis://127.0.0.1:P1,127.0.0.1:P2,...: kvtierd's --remote
"""

from __future__ import annotations

import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any, Optional

from kvtierd_process import _die_with_parent

START_TIMEOUT_S = 30.0


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RedisCluster:
    """`masters` masters, no replicas, every slot covered. Not thread-safe."""

    def __init__(self, masters: int = 3) -> None:
        self._tmp = tempfile.TemporaryDirectory(prefix="kvtier-redis-")
        self._masters = masters
        self.ports: list[int] = []
        self._procs: list[subprocess.Popen[bytes]] = []

    @property
    def url(self) -> str:
        return "redis://" + ",".join(f"127.0.0.1:{p}" for p in self.ports)

    def _cli(self, port: int, *args: str) -> str:
        done = subprocess.run(["redis-cli", "-h", "127.0.0.1", "-p", str(port), *args],
                              capture_output=True, text=True, timeout=START_TIMEOUT_S)
        return done.stdout + done.stderr

    def _start_node(self, i: int) -> None:
        node_dir = Path(self._tmp.name) / f"node{i}"
        node_dir.mkdir()
        port, bus = _free_port(), _free_port()
        log = open(node_dir / "redis.log", "ab")
        self._procs.append(subprocess.Popen(
            ["redis-server", "--bind", "127.0.0.1", "--port", str(port), "--cluster-enabled",
             "yes", "--cluster-port", str(bus), "--cluster-config-file", "nodes.conf",
             "--save", "", "--appendonly", "no", "--dir", str(node_dir),
             "--enable-debug-command", "local"],
            stdout=log, stderr=subprocess.STDOUT, preexec_fn=_die_with_parent))
        log.close()
        self.ports.append(port)

    def start(self) -> "RedisCluster":
        for i in range(self._masters):
            self._start_node(i)
        deadline = time.monotonic() + START_TIMEOUT_S
        for port in self.ports:
            while "PONG" not in self._cli(port, "ping"):
                self._check_alive()
                if time.monotonic() > deadline:
                    raise RuntimeError(f"redis-server on port {port} did not answer PING")
                time.sleep(0.05)
        created = subprocess.run(
            ["redis-cli", "--cluster", "create", *[f"127.0.0.1:{p}" for p in self.ports],
             "--cluster-replicas", "0", "--cluster-yes"],
            capture_output=True, text=True, timeout=START_TIMEOUT_S)
        if created.returncode != 0:
            raise RuntimeError(f"redis-cli --cluster create failed:\n{created.stdout}"
                               f"{created.stderr}")
        for port in self.ports:
            while "cluster_state:ok" not in self._cli(port, "cluster", "info"):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the cluster did not become ok on port {port}")
                time.sleep(0.05)
        return self

    def _check_alive(self) -> None:
        for proc, port in zip(self._procs, self.ports):
            if proc.poll() is not None:
                raise RuntimeError(f"redis-server on port {port} exited with {proc.returncode}")

    def stall(self, seconds: float) -> list[subprocess.Popen[bytes]]:
        """Makes every master stall for `seconds` (DEBUG SLEEP: it answers nothing meanwhile).
        Returns the redis-cli processes, which exit when the stall ends."""
        return [subprocess.Popen(["redis-cli", "-h", "127.0.0.1", "-p", str(p), "debug",
                                  "sleep", str(seconds)], stdout=subprocess.DEVNULL)
                for p in self.ports]

    def dbsize(self) -> int:
        """Keys held by all masters together."""
        return sum(int(self._cli(p, "dbsize").strip() or 0) for p in self.ports)

    def stop(self) -> None:
        for proc in self._procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait(timeout=30)
        self._procs.clear()
        self._tmp.cleanup()

    def __enter__(self) -> "RedisCluster":
        return self.start()

    def __exit__(self, *exc: Optional[Any]) -> None:
        self.stop()
