"""A real vLLM engine as a child process of a test (engine_driver.py), driven over JSON lines."""

from __future__ import annotations

import json
import os
import random
import select
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

from kvtierd_process import KvtierdProcess

DRIVER = Path(__file__).with_name("engine_driver.py")
START_TIMEOUT_S = 600.0  # about 55 s alone on 2 cores; more beside a parallel ctest
CALL_TIMEOUT_S = 300.0


def prompt(seed: int, length: int) -> list[int]:
    """`length` token ids drawn from the tiny models' vocabulary (3..2047) by `seed`."""
    rng = random.Random(seed)
    return [rng.randrange(3, 2048) for _ in range(length)]


def cold_salt() -> str:
    """A cache salt used once: nothing in vLLM or kvtier is keyed under it (a cold recompute)."""
    return "cold-" + uuid.uuid4().hex


class RealEngine:
    """One engine process. Its log is kept in `log_path`. Not thread-safe."""

    def __init__(self, model: str, log_path: Path, kvtier_socket: str = "",
                 extra: Optional[dict[str, Any]] = None, num_blocks: int = 0,
                 max_batched_tokens: int = 128, kv_role: str = "kv_both") -> None:
        self.log_path = log_path
        args = [sys.executable, str(DRIVER), "--model", model,
                "--max-batched-tokens", str(max_batched_tokens)]
        if kvtier_socket:
            args += ["--kvtier-socket", kvtier_socket, "--extra", json.dumps(extra or {}),
                     "--kv-role", kv_role]
        if num_blocks:
            args += ["--num-blocks", str(num_blocks)]
        self._log = open(log_path, "ab")
        self.proc = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self._log, env=dict(os.environ))

    def wait_ready(self) -> "RealEngine":
        self._read(START_TIMEOUT_S)
        return self

    def _read(self, timeout_s: float) -> dict[str, Any]:
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout_s
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"the engine did not answer in {timeout_s} s; its log:\n"
                                     + self.log_tail())
            ready, _, _ = select.select([self.proc.stdout], [], [], min(left, 1.0))
            if ready:
                line = self.proc.stdout.readline()
                if not line:
                    raise AssertionError(f"the engine exited ({self.proc.wait()}); its log:\n"
                                         + self.log_tail())
                answer = json.loads(line)
                if "error" in answer:
                    raise AssertionError(answer["error"])
                return dict(answer)

    def call(self, command: dict[str, Any]) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write((json.dumps(command) + "\n").encode())
        self.proc.stdin.flush()
        return self._read(CALL_TIMEOUT_S)

    def generate(self, requests: list[dict[str, Any]], reset: bool = True,
                 reset_connector: bool = False) -> dict[str, Any]:
        """Greedy outputs of `requests` ({"prompt", "max_tokens", "salt"}) in one batch."""
        return self.call({"op": "generate", "requests": requests, "reset": reset,
                          "reset_connector": reset_connector})

    def one(self, prompt: list[int], max_tokens: int = 12,
            salt: Optional[str] = None) -> tuple[list[int], int]:
        """The greedy output of one prompt and its num_cached_tokens (vLLM's prefix cache
        emptied first, so those came from kvtier)."""
        out = self.generate([{"prompt": prompt, "max_tokens": max_tokens, "salt": salt}])
        first = out["outputs"][0]
        return first["tokens"], first["num_cached_tokens"]

    def log_tail(self, lines: int = 60) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                assert self.proc.stdin is not None
                self.proc.stdin.write(b'{"op": "quit"}\n')
                self.proc.stdin.flush()
                self.proc.wait(timeout=60)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait(timeout=30)
        self._log.close()


def hybrid_rig(root: Path, write_model: Callable[[Path, int], str], extra: dict[str, Any]
               ) -> Iterator[tuple[KvtierdProcess, RealEngine]]:
    """A kvtierd and one engine on it serving the model `write_model` writes (seed 1) under
    `root`: a module fixture's body (stopped when the generator closes)."""
    (root / "kvtierd").mkdir(parents=True, exist_ok=True)
    daemon = KvtierdProcess(dram_bytes="256MiB", workdir=root / "kvtierd").start()
    try:
        engine = RealEngine(write_model(root / "model", 1), root / "engine.log", daemon.socket,
                            extra, num_blocks=64).wait_ready()
        try:
            yield daemon, engine
        finally:
            engine.close()
    finally:
        daemon.stop()


def cold_context_sensitive(engine: RealEngine, p: list[int]) -> list[int]:
    """The cold greedy output of `p`, checked to change when one early token does."""
    changed = list(p)
    changed[3] = (changed[3] + 1) % 2048
    cold, cached_cold = engine.one(p, salt=cold_salt())
    assert cached_cold == 0
    assert engine.one(changed, salt=cold_salt())[0] != cold, "the model is not context-sensitive"
    return cold


def check_a_failed_load_recomputes(engine: RealEngine, p: list[int], stored_tokens: int,
                                   wait_s: float) -> None:
    """A hybrid model's load whose chunks are evicted under it (after `wait_s`, past the
    prefetch's deadline) fails the request (failed_recving) and vLLM recomputes it; the prefix
    is then stored again."""
    cold, _ = engine.one(p, salt=cold_salt())
    engine.one(p)  # stored
    engine.generate([{"prompt": prompt(99, 300), "max_tokens": 4}])  # stale data in the blocks
    assert engine.call({"op": "evict_before_next_load", "wait_s": wait_s})["armed"]
    faulty = engine.generate([{"prompt": p, "max_tokens": 12}])
    assert faulty["fault"]["evicted"] > 0, "the fault did not run"
    assert faulty["outputs"][0]["tokens"] == cold
    out, cached = engine.one(p)
    assert cached == stored_tokens, "the prefix was not stored again"
    assert out == cold
