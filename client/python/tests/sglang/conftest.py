"""The SGLang storage backend tests use the kvtierd fixture of ../conftest.py; this puts
their helpers (sglang_pools) on the path."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
