"""The vLLM connector tests use the kvtierd fixture of ../conftest.py; this adds a tiny local
model config and puts their helpers (engine_harness) on the path."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    from engine_harness import write_tiny_model
    return write_tiny_model(tmp_path_factory.mktemp("tiny-llama"))
