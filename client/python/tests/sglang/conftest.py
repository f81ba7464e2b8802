"""Fixtures of the SGLang storage backend tests: a real kvtierd per test."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Iterator

import pytest

sys.path.insert(0, str(Path(__file__).parent.parent))
sys.path.insert(0, str(Path(__file__).parent))

from kvtierd_process import KvtierdProcess  # noqa: E402


@pytest.fixture
def kvtierd() -> Iterator[KvtierdProcess]:
    with KvtierdProcess() as daemon:
        yield daemon
