"""Engine-side names as kvtier namespace fields (shared by the integrations)."""

from __future__ import annotations

import hashlib
import unicodedata
from typing import Optional


def _fits(value: str) -> bool:
    """Whether kvtier takes `value` as it is: at most 512 bytes of UTF-8, no '|' and no
    control character (Unicode's Cc: C0, DEL and C1, which kvtier refuses)."""
    if "|" in value or any(unicodedata.category(c) == "Cc" for c in value):
        return False
    try:
        return len(value.encode()) <= 512
    except UnicodeEncodeError:  # a lone surrogate
        return False


def namespace_text(value: Optional[str]) -> str:
    """A model name, cache salt or LoRA name as a namespace field: kvtier's fields hold at
    most 512 bytes of UTF-8, no '|' and no control character, so any other value is replaced
    by its SHA-256 (still one namespace per value). None and "" give ""."""
    if not value:
        return ""
    if not _fits(value):
        return "sha256:" + hashlib.sha256(value.encode("utf-8", "surrogatepass")).hexdigest()
    return value
