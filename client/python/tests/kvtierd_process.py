"""The real kvtierd as a child process of a test (never a mock).

``KvtierdProcess`` starts ``$KVTIER_BIN_DIR/kvtierd`` on a socket in a fresh 0700 directory,
waits (bounded) until it answers ``AdminClient.health()``, and stops it with SIGTERM (SIGKILL
after a timeout). The child gets PR_SET_PDEATHSIG(SIGKILL), so it dies with the test process
even when a test runner kills that.
"""

from __future__ import annotations

import ctypes
import glob
import os
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Optional

import kvtier

_PR_SET_PDEATHSIG = 1


def bin_dir() -> Path:
    """Directory of kvtierd and kvtierctl: $KVTIER_BIN_DIR, else build/bin of this checkout."""
    env = os.environ.get("KVTIER_BIN_DIR")
    if env:
        return Path(env).resolve()
    return Path(__file__).resolve().parents[3] / "build" / "bin"


def _die_with_parent() -> None:
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


class KvtierdProcess:
    """One kvtierd on its own socket. Not thread-safe."""

    def __init__(self, dram_bytes: str = "64MiB", extra_args: Optional[list[str]] = None,
                 workdir: Optional[Path] = None) -> None:
        self._tmp = tempfile.TemporaryDirectory(prefix="kvtier-py-")
        self.dir = Path(workdir) if workdir else Path(self._tmp.name)
        os.chmod(self.dir, 0o700)
        self.socket = str(self.dir / "kvtierd.sock")
        self.log_path = self.dir / "kvtierd.log"
        self.args = [str(bin_dir() / "kvtierd"), "--socket", self.socket,
                     "--dram-bytes", dram_bytes]
        extra = list(extra_args or [])
        if "--nvme-bytes" not in extra and "--nvme-path" not in extra:
            extra += ["--nvme-bytes", "0"]
        if "--metrics-address" not in extra:  # 127.0.0.1:9400 by default, one per machine
            extra += ["--metrics-address", "off"]
        self.args += extra
        self.proc: Optional[subprocess.Popen[bytes]] = None

    def start(self, timeout_s: float = 20.0) -> "KvtierdProcess":
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(self.args, stdout=log, stderr=subprocess.STDOUT,
                                     cwd=self.dir, preexec_fn=_die_with_parent)
        log.close()
        admin = kvtier.AdminClient.connect(self.socket, deadline_ms=500)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"kvtierd exited with {self.proc.returncode}:\n{self.log()}")
            try:
                if admin.health()["serving"]:
                    return self
            except kvtier.Error:
                pass
            time.sleep(0.05)
        raise RuntimeError(f"kvtierd did not become healthy in {timeout_s} s:\n{self.log()}")

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def admin(self) -> kvtier.AdminClient:
        return kvtier.AdminClient.connect(self.socket, deadline_ms=2000)

    def pause(self) -> None:
        """SIGSTOP: the daemon accepts nothing and answers nothing until resume().

        Returns once every thread of it is stopped: kill() returns before a thread
        running on another CPU has stopped, and that thread could still answer a call.
        """
        assert self.proc is not None
        self.proc.send_signal(signal.SIGSTOP)
        deadline = time.monotonic() + 5.0
        while time.monotonic() < deadline:
            tasks = glob.glob(f"/proc/{self.proc.pid}/task/*/stat")
            if all(_task_state(stat) == "T" for stat in tasks):
                return
            time.sleep(0.001)
        raise AssertionError(f"kvtierd (pid {self.proc.pid}) did not stop within 5 s of SIGSTOP")

    def resume(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGCONT)

    def kill9(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.kill()
            self.proc.wait(timeout=10)

    def stop(self, timeout_s: float = 30.0) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGCONT)
        self.proc.terminate()
        try:
            self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)

    def close(self) -> None:
        self.stop()
        self._tmp.cleanup()

    def __enter__(self) -> "KvtierdProcess":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


def _task_state(stat_path: str) -> str:
    """The state letter of one thread (/proc/PID/task/TID/stat); "T" once a thread
    that exited meanwhile is gone, so it does not hold the wait up."""
    try:
        with open(stat_path) as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "T"
