"""Fixtures shared by the kvtier Python tests: a real kvtierd per test."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Iterator

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from kvtierd_process import KvtierdProcess  # noqa: E402


@pytest.fixture
def kvtierd() -> Iterator[KvtierdProcess]:
    """A fresh kvtierd (64 MiB DRAM, no NVMe) on a socket of its own."""
    with KvtierdProcess() as daemon:
        yield daemon
