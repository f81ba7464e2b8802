"""The real-engine tests' helpers (kvtierd_process in ../, the driver and model here), and the
hybrid-model tests' rig: a module that names WRITE_MODEL (a tiny model's writer) and EXTRA (the
connector's kv_connector_extra_config) gets a kvtierd (`hybrid_kvtierd`) and one engine on it
serving that model (`hybrid_engine`)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Iterator

import pytest

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from kvtierd_process import KvtierdProcess  # noqa: E402
from real_engine import RealEngine, hybrid_rig  # noqa: E402


@pytest.fixture(scope="module")
def hybrid(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
           ) -> Iterator[tuple[KvtierdProcess, RealEngine]]:
    root = tmp_path_factory.mktemp(request.module.__name__)
    yield from hybrid_rig(root, request.module.WRITE_MODEL, request.module.EXTRA)


@pytest.fixture(scope="module")
def hybrid_kvtierd(hybrid: tuple[KvtierdProcess, RealEngine]) -> KvtierdProcess:
    return hybrid[0]


@pytest.fixture(scope="module")
def hybrid_engine(hybrid: tuple[KvtierdProcess, RealEngine]) -> RealEngine:
    return hybrid[1]
