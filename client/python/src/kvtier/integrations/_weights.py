"""A fingerprint of a model's weights, for the namespace (shared by the integrations).

Two engines that load different weights under the same model name must not share KV: the
connector appends this fingerprint to the model id. It is a SHA-256 over, for each weight and
config file of the model folder (sorted by name): the file's name and size, the whole of a
small file (config, index, tokenizer-free JSON) and of a safetensors header, and 16 evenly
spaced 64 KiB samples of the rest. Headers alone would not do: two checkpoints of one
architecture (a fine-tune and its base, or two random initialisations) have the same tensor
names, shapes and offsets; their sampled bytes differ. Reading about 1 MiB a file keeps the
start cheap for checkpoints of hundreds of GB; byte-identical copies in other folders or on
other machines get the same fingerprint.
"""

from __future__ import annotations

import hashlib
import os
import struct
from pathlib import Path
from typing import Optional

from kvtier.integrations._names import namespace_text

_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")
_WHOLE_FILES = ("config.json", "params.json", "model.safetensors.index.json",
                "pytorch_model.bin.index.json", "quantize_config.json", "hf_quant_config.json",
                "adapter_config.json")
_SAMPLES, _SAMPLE_BYTES, _SMALL_FILE = 16, 64 << 10, 1 << 20
_MAX_SAFETENSORS_HEADER = 100 << 20


def _hash_file(h: "hashlib._Hash", path: Path) -> None:
    size = path.stat().st_size
    h.update(f"{path.name}\0{size}\0".encode())
    with open(path, "rb") as f:
        if size <= _SMALL_FILE or path.name in _WHOLE_FILES:
            h.update(f.read())
            return
        if path.suffix == ".safetensors":
            (header_len,) = struct.unpack("<Q", f.read(8))
            h.update(f.read(min(header_len, _MAX_SAFETENSORS_HEADER)))
        for i in range(_SAMPLES):
            f.seek((size - _SAMPLE_BYTES) * i // (_SAMPLES - 1))
            h.update(f.read(_SAMPLE_BYTES))


def _model_folder(model: str, revision: Optional[str]) -> Optional[Path]:
    """The local folder of `model`: itself, or its snapshot in the Hugging Face cache (the
    engine has downloaded it before it builds its KV connector); None when neither exists."""
    if os.path.isdir(model):
        return Path(model)
    try:
        from huggingface_hub import snapshot_download
        return Path(snapshot_download(model, revision=revision, local_files_only=True))
    except Exception:  # not a hub id, not cached, or no huggingface_hub
        return None


def weights_fingerprint(model: str, revision: Optional[str] = None) -> Optional[str]:
    """32 hex digits identifying the weights and config of `model` (a folder or a cached hub
    id); None when no weight file can be found."""
    folder = _model_folder(model, revision)
    if folder is None:
        return None
    files = sorted(p for p in folder.iterdir()
                   if p.is_file() and (p.suffix in _WEIGHT_SUFFIXES or p.name in _WHOLE_FILES))
    if not any(p.suffix in _WEIGHT_SUFFIXES for p in files):
        return None
    h = hashlib.sha256(b"kvtier-weights/v1\0")
    for path in files:
        _hash_file(h, path)
    return h.hexdigest()[:32]


def namespace_model_id(model_id: str, fingerprint: str, model: str,
                       revision: Optional[str] = None) -> str:
    """The namespace's model id: `model_id`, with the fingerprint of `model`'s weights
    (``fingerprint`` "auto"), none ("off"), or ``fingerprint`` itself. ValueError when "auto"
    finds no weight file."""
    if fingerprint == "off":
        return namespace_text(model_id)
    if fingerprint == "auto":
        found = weights_fingerprint(model, revision)
        if found is None:
            raise ValueError(
                f"kvtier: no weight files of model {model!r} found (neither a folder nor in the "
                "Hugging Face cache) to fingerprint, so engines serving other weights under "
                "this name could share its KV; set kv_connector_extra_config "
                "weights_fingerprint to a string naming these weights, or to \"off\"")
        fingerprint = found
    return namespace_text(f"{model_id}@weights:{fingerprint}")
