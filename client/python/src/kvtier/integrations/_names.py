"""Engine-side names as kvtier namespace fields (shared by the integrations)."""

from __future__ import annotations

import hashlib
from typing import Optional


def namespace_text(value: Optional[str]) -> str:
    """A model name, cache salt or LoRA name as a namespace field: kvtier's fields hold at
    most 512 bytes and no '|', so any other value is replaced by its SHA-256 (still one
    namespace per value). None and "" give ""."""
    if not value:
        return ""
    if "|" in value or len(value.encode()) > 512:
        return "sha256:" + hashlib.sha256(value.encode()).hexdigest()
    return value
