#!/usr/bin/env python3
"""Regenerates the golden vectors of tests/common/chunk_key_test.cc.

An implementation independent of the C++ code: it follows DESIGN.md ("namespace
digest", "chunk key") with the Python `xxhash` package (pip install xxhash).
A 128-bit value is printed as lo/hi 64-bit halves and as hexdigest() (high64
first, the same text as ChunkKey::ToHex()).

    python3 tests/common/golden_keys.py
"""
import struct

import xxhash


def canonical(model, lora="", dtype="fp16", layout="mha", layers=0, kv_heads=0, head_dim=0,
              latent_dim=0, chunk_tokens=256, tp_rank=0, tp_size=1, salt=""):
    return (f"kvtier/v1|model={model}|lora={lora}|dtype={dtype}|layout={layout}"
            f"|layers={layers}|kv_heads={kv_heads}|head_dim={head_dim}|latent_dim={latent_dim}"
            f"|chunk_tokens={chunk_tokens}|tp_rank={tp_rank}|tp_size={tp_size}|salt={salt}")


def wire(value):  # 16 bytes: low64 LE then high64 LE
    return value.to_bytes(16, "little")


def chunk_keys(digest, tokens, chunk_tokens):
    keys, parent = [], digest
    for i in range(len(tokens) // chunk_tokens):
        chunk = tokens[i * chunk_tokens:(i + 1) * chunk_tokens]
        parent = xxhash.xxh3_128_intdigest(wire(parent) + struct.pack(f"<{len(chunk)}i", *chunk))
        keys.append(parent)
    return keys


def show(name, value):
    lo, hi = value & (2**64 - 1), value >> 64
    print(f"  {name}: {{0x{lo:016x}ULL, 0x{hi:016x}ULL, \"{value:032x}\"}}")


def case(title, spec, tokens):
    s = canonical(**spec)
    digest = xxhash.xxh3_128_intdigest(s.encode("utf-8"))
    print(f"{title}\n  canonical: {s}")
    show("digest", digest)
    for i, k in enumerate(chunk_keys(digest, tokens, spec["chunk_tokens"])):
        show(f"key[{i}]", k)


if __name__ == "__main__":
    print(f"python xxhash {xxhash.VERSION} (libxxhash {xxhash.XXHASH_VERSION})")
    tiny = dict(model="test-model", layers=2, kv_heads=1, head_dim=64, chunk_tokens=4)
    case("tiny, tokens 0..11", tiny, list(range(12)))
    case("tiny, tokens -1, -2, INT32_MAX, INT32_MIN", tiny, [-1, -2, 2**31 - 1, -2**31])
    llama = dict(model="meta-llama/Llama-3.1-8B", layers=32, kv_heads=8, head_dim=128,
                 chunk_tokens=256)
    case("llama3-8b, tokens i*7 % 128000 for i < 512", llama,
         [i * 7 % 128000 for i in range(512)])
    # One chain of 3 chunks per chunk size, across XXH3's input-length paths (17-128,
    # 129-240 and longer bytes with the 16-byte parent) and kvtier's own switch from a
    # one-shot hash to a streaming one above 2048 tokens. Token i: (i * 2654435761) mod 2^32
    # as a signed int32; the parent of chunk 0 is the tiny digest.
    tiny_digest = xxhash.xxh3_128_intdigest(canonical(**tiny).encode("utf-8"))
    print("sizes: key[2] of a 3-chunk chain under the tiny digest")
    for c in (1, 28, 56, 57, 256, 2048, 2049, 5000):
        tokens = [struct.unpack("<i", struct.pack("<I", (i * 2654435761) % 2**32))[0]
                  for i in range(3 * c)]
        show(f"chunk_tokens {c}", chunk_keys(tiny_digest, tokens, c)[2])
