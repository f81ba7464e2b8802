"""The vLLM connector tests use the kvtierd fixture of ../conftest.py; this adds a tiny local
model config and puts their helpers (engine_harness) on the path."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any, Iterator

import pytest

sys.path.insert(0, str(Path(__file__).parent))
# vLLM's CPU platform, as the real-engine tests use: it loads the CPU kernels built for this
# CPU (_C_AVX2 or _C_AVX512). Without a platform vLLM imports vllm/_C, the AVX512-BF16 build
# the venv carries for the real engine, which dies with SIGILL on a CPU without those.
os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    from engine_harness import write_tiny_model
    return write_tiny_model(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture
def engines(kvtierd: Any, model_dir: str) -> Iterator[list[Any]]:
    """The harness engines a test made (connector_helpers.make), closed after it."""
    made: list[Any] = []
    yield made
    for e in made:
        e.close()
