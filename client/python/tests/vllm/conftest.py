"""Fixtures of the vLLM connector tests: a real kvtierd and a tiny local model config."""

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


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    from engine_harness import write_tiny_model
    return write_tiny_model(tmp_path_factory.mktemp("tiny-llama"))
