"""LayerwiseStorer/LayerwiseLoader through the binding on the host-emulation backend: CPU
arrays stand in for the engine's paged KV cache, a real kvtierd in between."""

from __future__ import annotations

import numpy as np
import pytest

import kvtier
from kvtierd_process import KvtierdProcess

CHUNK, BLOCK, HEADS, DIM, LAYERS, BLOCKS = 32, 8, 2, 4, 3, 40


def open_ns(c: kvtier.Client) -> kvtier.Namespace:
    return c.open_namespace(model_id="test/layerwise", num_layers=LAYERS, kv_dtype=np.float16,
                            num_kv_heads=HEADS, head_dim=DIM, chunk_tokens=CHUNK)


def bhnc_cache(seed: int | None) -> list[np.ndarray]:
    """vLLM's per-layer [num_blocks, heads, block_size, 2 * head_dim] views."""
    rng = np.random.default_rng(seed)
    shape = (BLOCKS, HEADS, BLOCK, 2 * DIM)
    if seed is None:
        return [np.zeros(shape, dtype=np.float16) for _ in range(LAYERS)]
    return [rng.standard_normal(shape).astype(np.float16) for _ in range(LAYERS)]


def tokens_kv(layers: list[np.ndarray], block_ids: list[int], num_tokens: int) -> np.ndarray:
    """[layers][tokens][heads][2 * dim]: the KV of the prompt's tokens, gathered by block."""
    out = np.empty((LAYERS, num_tokens, HEADS, 2 * DIM), dtype=np.float16)
    for t in range(num_tokens):
        b, off = block_ids[t // BLOCK], t % BLOCK
        for layer in range(LAYERS):
            out[layer, t] = layers[layer][b, :, off, :]
    return out


def run_store(c: kvtier.Client, ns: kvtier.Namespace, rt: kvtier.Runtime,
              arena: kvtier.GpuArena, layers: list[np.ndarray], tokens: np.ndarray,
              block_ids: list[int]) -> kvtier.StoreResult:
    cache = kvtier.PagedKvCache("vllm_bhnc", layers)
    storer = kvtier.LayerwiseStorer(c, ns, arena, cache, rt)
    store_stream, compute = rt.create_stream(), rt.create_stream()
    assert storer.start(tokens, block_ids, store_stream) == len(tokens) // CHUNK
    for layer in range(LAYERS):
        storer.layer_done(layer, compute)
    return storer.finish()


def test_layerwise_store_then_load_is_bit_exact_into_other_blocks(kvtierd: KvtierdProcess) -> None:
    rt = kvtier.Runtime.host()
    arena = kvtier.GpuArena(rt)
    with kvtier.Client.connect(socket=kvtierd.socket, deadline_ms=2000) as c:
        ns = open_ns(c)
        tokens = np.arange(3 * CHUNK + 5, dtype=np.int64) * 7 + 1
        src = bhnc_cache(seed=1)
        src_blocks = list(np.random.default_rng(2).permutation(BLOCKS)[:13])
        stored = run_store(c, ns, rt, arena, src, tokens, src_blocks)
        assert stored.stored_chunks == 3 and stored.fail_open is None

        dst = bhnc_cache(seed=None)
        dst_blocks = list(np.random.default_rng(3).permutation(BLOCKS)[:13])
        loader = kvtier.LayerwiseLoader(c, ns, arena, kvtier.PagedKvCache("vllm_bhnc", dst), rt)
        load_stream, compute = rt.create_stream(), rt.create_stream()
        assert loader.start_load(tokens, dst_blocks, load_stream) == 3 * CHUNK
        for layer in range(LAYERS):
            loader.wait_layer(layer, compute)
        assert loader.finish() == []
        n = 3 * CHUNK
        assert np.array_equal(tokens_kv(dst, dst_blocks, n).view(np.uint16),
                              tokens_kv(src, src_blocks, n).view(np.uint16))
        # Blocks outside the table were not touched.
        untouched = sorted(set(range(BLOCKS)) - set(dst_blocks[:n // BLOCK]))
        assert not any(dst[layer][untouched].any() for layer in range(LAYERS))


def test_layerwise_matches_the_payload_layout_of_client_load(kvtierd: KvtierdProcess) -> None:
    """A layerwise store is readable by a plain load, in DESIGN.md's payload order
    [layers][K,V][chunk_tokens][heads][head_dim]."""
    rt = kvtier.Runtime.host()
    arena = kvtier.GpuArena(rt)
    with kvtier.Client.connect(socket=kvtierd.socket, deadline_ms=2000) as c:
        ns = open_ns(c)
        tokens = np.arange(CHUNK, dtype=np.int32) + 100
        src = bhnc_cache(seed=4)
        blocks = [5, 9, 2, 30]
        assert run_store(c, ns, rt, arena, src, tokens, blocks).stored_chunks == 1
        payload = np.zeros(ns.payload_bytes, dtype=np.uint8)
        assert c.load(ns, tokens, payload).num_chunks == 1
        got = payload.view(np.float16).reshape(LAYERS, 2, CHUNK, HEADS, DIM)
        kv = tokens_kv(src, blocks, CHUNK)  # [layers][tokens][heads][K dims | V dims]
        assert np.array_equal(got[:, 0].view(np.uint16), kv[..., :DIM].view(np.uint16))
        assert np.array_equal(got[:, 1].view(np.uint16), kv[..., DIM:].view(np.uint16))


def test_nhd_strides_and_first_chunk(kvtierd: KvtierdProcess) -> None:
    """A cache laid out [blocks, block_size, heads, 2*dim] in memory (vLLM's NHD), seen
    through a [B, H, N, C] view; chunks before first_chunk are leased, not copied."""
    rt = kvtier.Runtime.host()
    arena = kvtier.GpuArena(rt)
    with kvtier.Client.connect(socket=kvtierd.socket, deadline_ms=2000) as c:
        ns = open_ns(c)
        tokens = np.arange(2 * CHUNK, dtype=np.int32) + 5
        src = bhnc_cache(seed=5)
        blocks = list(range(8))
        run_store(c, ns, rt, arena, src, tokens, blocks)
        nhd = [np.zeros((BLOCKS, BLOCK, HEADS, 2 * DIM), dtype=np.float16) for _ in range(LAYERS)]
        views = [x.transpose(0, 2, 1, 3) for x in nhd]  # logical [B, H, N, C]
        loader = kvtier.LayerwiseLoader(c, ns, arena, kvtier.PagedKvCache("vllm_bhnc", views), rt)
        assert loader.start_load(tokens, blocks, rt.create_stream(), first_chunk=1) == 2 * CHUNK
        assert loader.finish() == []
        first = CHUNK // BLOCK
        assert not any(v[:first].any() for v in views)  # chunk 0 was not copied
        assert np.array_equal(tokens_kv(views, blocks, 2 * CHUNK)[:, CHUNK:].view(np.uint16),
                              tokens_kv(src, blocks, 2 * CHUNK)[:, CHUNK:].view(np.uint16))


def test_bad_caches_raise_invalid_argument(kvtierd: KvtierdProcess) -> None:
    rt = kvtier.Runtime.host()
    arena = kvtier.GpuArena(rt)
    with kvtier.Client.connect(socket=kvtierd.socket, deadline_ms=2000) as c:
        ns = open_ns(c)
        with pytest.raises(kvtier.InvalidArgument, match="kind"):
            kvtier.PagedKvCache("paged", bhnc_cache(seed=None))
        with pytest.raises(kvtier.InvalidArgument, match="4 dimensions"):
            kvtier.PagedKvCache("vllm_bhnc", [np.zeros((4, 4), dtype=np.float16)])
        with pytest.raises(kvtier.InvalidArgument, match=r"layers\[1\]"):
            kvtier.PagedKvCache("vllm_bhnc", [bhnc_cache(None)[0],
                                              np.zeros((BLOCKS, HEADS, BLOCK, 2 * DIM),
                                                       dtype=np.float32)])
        wrong_heads = [np.zeros((BLOCKS, HEADS + 1, BLOCK, 2 * DIM), dtype=np.float16)] * LAYERS
        loader = kvtier.LayerwiseLoader(c, ns, arena, kvtier.PagedKvCache("vllm_bhnc", wrong_heads),
                                        rt)
        with pytest.raises(kvtier.InvalidArgument):
            loader.start_load(np.arange(CHUNK, dtype=np.int32), list(range(4)), rt.create_stream())
        with pytest.raises(kvtier.Unavailable, match="host backend"):
            rt.wrap_stream(0)
        try:
            assert kvtier.Runtime.cuda(0).name == "cuda:0"
        except kvtier.Unavailable:
            pass  # no GPU or driver here: a clear error, not a crash


def test_kv_cache_groups_each_move_through_their_own_block_table(kvtierd: KvtierdProcess) -> None:
    """vLLM's hybrid allocator: layer 0 in one group, layers 1-2 in another (a sliding window
    that needs only chunks 1 and 2 back: -1 for chunk 0's blocks)."""
    rt = kvtier.Runtime.host()
    arena = kvtier.GpuArena(rt)
    per_chunk = CHUNK // BLOCK
    with kvtier.Client.connect(socket=kvtierd.socket, deadline_ms=2000) as c:
        ns = open_ns(c)
        tokens = np.arange(3 * CHUNK, dtype=np.int64) * 5 + 3
        rng = np.random.default_rng(4)
        src, dst = bhnc_cache(seed=5), bhnc_cache(seed=None)
        src_tables = tuple(list(rng.permutation(BLOCKS)[:12]) for _ in range(2))
        dst_tables = tuple(list(rng.permutation(BLOCKS)[:12]) for _ in range(2))
        dst_tables[1][:per_chunk] = [-1] * per_chunk
        cache = kvtier.PagedKvCache("vllm_bhnc", src, group_layers=[1, 2])
        assert cache.num_groups == 2
        storer = kvtier.LayerwiseStorer(c, ns, arena, cache, rt)
        store_stream, compute = rt.create_stream(), rt.create_stream()
        assert storer.start(tokens, src_tables, store_stream) == 3
        for layer in range(LAYERS):
            storer.layer_done(layer, compute)
        assert storer.finish().stored_chunks == 3

        loader = kvtier.LayerwiseLoader(
            c, ns, arena, kvtier.PagedKvCache("vllm_bhnc", dst, group_layers=[1, 2]), rt)
        assert loader.start_load(tokens, dst_tables, rt.create_stream()) == 3 * CHUNK
        for layer in range(LAYERS):
            loader.wait_layer(layer, compute)
        assert loader.finish() == []
        n = 3 * CHUNK
        assert np.array_equal(tokens_kv(dst, dst_tables[0], n)[0].view(np.uint16),
                              tokens_kv(src, src_tables[0], n)[0].view(np.uint16))
        got = tokens_kv(dst, [0] * per_chunk + dst_tables[1][per_chunk:], n)
        want = tokens_kv(src, src_tables[1], n)
        assert np.array_equal(got[1:, CHUNK:].view(np.uint16), want[1:, CHUNK:].view(np.uint16))
        written = set(dst_tables[1][per_chunk:])
        assert not any(dst[layer][sorted(set(range(BLOCKS)) - written)].any() for layer in (1, 2))

        with pytest.raises(kvtier.InvalidArgument, match="add up to 2 layers; cache.layers holds 3"):
            kvtier.PagedKvCache("vllm_bhnc", src, group_layers=[1, 1])
        with pytest.raises(kvtier.InvalidArgument, match=r"group_layers\[0\] is 0"):
            kvtier.PagedKvCache("vllm_bhnc", src, group_layers=[0, 3])
        one_table = kvtier.LayerwiseLoader(c, ns, arena, cache, rt)
        with pytest.raises(kvtier.InvalidArgument, match="1 block tables for 2 KV cache groups"):
            one_table.start_load(tokens, src_tables[0], rt.create_stream())
        with pytest.raises(kvtier.InvalidArgument, match=r"block_ids\[1\]"):
            one_table.start_load(tokens, (src_tables[0], ["x"]), rt.create_stream())
