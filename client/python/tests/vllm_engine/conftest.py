"""The real-engine tests' helpers (kvtierd_process in ../, the driver and model here)."""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))
