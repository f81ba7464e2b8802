"""Engine-side names as kvtier namespace fields (shared by the integrations)."""

from __future__ import annotations

import hashlib
import struct
import unicodedata
from typing import Any, Optional

import numpy as np


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


def key_tokens(prompt_token_ids: Optional[list[int]], mm_features: Optional[list[Any]],
               chunk_tokens: int) -> list[int]:
    """The ids kvtier keys a prompt's chunks on. Without multimodal items, the prompt's own.
    A chunk that holds any part of an image, audio or video item has every id replaced: a
    placeholder id is the same whatever the content, so the ids alone would give two
    requests with the same text and other images the same keys. Each id of such a chunk
    becomes ``-1 - ((id ^ w) & 0x7FFFFFFF)`` with w a word of the SHA-256 of the content
    hashes (vLLM's ``identifier``, as its own block hasher mixes in) and offsets of the
    items in the chunk: negative, so never a vocabulary id, and one-to-one for given items.
    """
    tokens = list(prompt_token_ids or [])
    if not mm_features:
        return tokens
    items: dict[int, list[str]] = {}
    for feature in mm_features:
        offset, length = feature.mm_position.offset, feature.mm_position.length
        if length <= 0:
            continue
        for c in range(offset // chunk_tokens, (offset + length - 1) // chunk_tokens + 1):
            items.setdefault(c, []).append(f"{feature.identifier}@{offset}+{length}")
    for c, names in items.items():
        words = struct.unpack("<8I", hashlib.sha256("\0".join(names).encode()).digest())
        for i in range(c * chunk_tokens, min((c + 1) * chunk_tokens, len(tokens))):
            tokens[i] = -1 - ((tokens[i] ^ words[i % 8]) & 0x7FFFFFFF)
    return tokens


def engine_key_tokens(hashes: list[bytes], chunk_tokens: int) -> np.ndarray:
    """The "token ids" of engine-keyed chunks (``open_namespace(engine_keyed=True)``),
    [len(hashes) * chunk_tokens] int32: each hash (at most 32 bytes, zero-padded to 32) as its
    chunk's first 8 little-endian int32, zeros after."""
    out = np.zeros((len(hashes), chunk_tokens), dtype=np.int32)
    for i, h in enumerate(hashes):
        out[i, :8] = np.frombuffer(h.ljust(32, b"\0"), dtype="<i4")
    return out.reshape(-1)
