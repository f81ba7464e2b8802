"""KvtierStorage's v2 pool API, host layouts and rank namespaces against the real sglang 0.5.23
package (its host pool classes, PoolTransfer, PoolHitPolicy, HiCacheStorageExtraInfo) and a
real kvtierd. The expected hits follow the rules of SGLang's HiCacheStorage.batch_exists_v2
docstring: ALL_PAGES needs every page of the prefix, TRAILING_PAGES the last len(keys) pages
before the prefix's end; the usable prefix is the longest every pool allows."""

from __future__ import annotations

import inspect

import pytest
import torch
from sglang.srt.mem_cache.hicache_storage import (HiCacheStorage, HiCacheStorageExtraInfo,
                                                  PoolHitPolicy, PoolName, PoolTransfer)

from kvtier.integrations.sglang import KvtierStorage
from kvtierd_process import KvtierdProcess
from sglang_pools import (PAGE, host_pool, indices, mamba_pool, mamba_state, mla_pool,
                          page_keys, page_kv, storage)

ALL, TRAILING = PoolHitPolicy.ALL_PAGES, PoolHitPolicy.TRAILING_PAGES


def hybrid(socket: str, seed: int | None, **kw: object) -> tuple[KvtierStorage, dict]:
    """A backend with SGLang's pool group of a hybrid model registered: the KV pool, Mamba
    state, a one-layer sliding-window KV pool and an indexer stand-in (an MLA host pool:
    SGLang's DSA indexer pool needs a device pool)."""
    s = None if seed is None else seed
    pools = {PoolName.KV: host_pool("page_first", s),
             PoolName.MAMBA: mamba_pool(None if s is None else s + 1),
             PoolName.SWA: host_pool("layer_first", None if s is None else s + 2, layers=1),
             PoolName.INDEXER: mla_pool("layer_first", None if s is None else s + 3)}
    backend = storage(socket, pools[PoolName.KV], **kw)
    for name, pool in pools.items():
        backend.register_mem_host_pool_v2(pool, name)
    return backend, pools


def slots(pages: list[int]) -> torch.Tensor:
    """Mamba host slots (page size 1)."""
    return torch.tensor(pages, dtype=torch.int64)


def test_hybrid_round_trip_is_bit_exact(kvtierd: KvtierdProcess) -> None:
    a, src = hybrid(kvtierd.socket, seed=40)
    b, dst = hybrid(kvtierd.socket, seed=None)
    keys = page_keys(4, "hybrid")
    # SGLang's backup of one span: KV through v1, each sidecar through v2 (Mamba: the state
    # at the span's end; SWA: the window of its last two pages; the indexer: every page).
    assert a.batch_set_v1(keys, indices([1, 2, 3, 4])) == [True] * 4
    stored = a.batch_set_v2([
        PoolTransfer(PoolName.MAMBA, host_indices=slots([5]), keys=keys[3:], hit_policy=TRAILING),
        PoolTransfer(PoolName.SWA, host_indices=indices([3, 4]), keys=keys[2:],
                     hit_policy=TRAILING),
        PoolTransfer(PoolName.INDEXER, host_indices=indices([1, 2, 3, 4]), keys=keys)],
        extra_info=HiCacheStorageExtraInfo(prefix_keys=[]))
    assert stored == {PoolName.MAMBA: [True], PoolName.SWA: [True, True],
                      PoolName.INDEXER: [True] * 4}
    query = [PoolTransfer(PoolName.MAMBA, keys=keys[3:], hit_policy=TRAILING),
             PoolTransfer(PoolName.SWA, keys=keys[2:], hit_policy=TRAILING),
             PoolTransfer(PoolName.INDEXER, keys=keys, hit_policy=ALL)]
    hit = b.batch_exists_v2(keys, query)
    # Only the whole span ends where the Mamba state and the SWA window were stored.
    assert hit.kv_hit_pages == 4 and hit.restorable_prefix_pages == [4]
    assert b.batch_get_v1(keys, indices([7, 8, 9, 10])) == [True] * 4
    got = b.batch_get_v2([
        PoolTransfer(PoolName.MAMBA, host_indices=slots([2]), keys=keys[3:]),
        PoolTransfer(PoolName.SWA, host_indices=indices([11, 12]), keys=keys[2:]),
        PoolTransfer(PoolName.INDEXER, host_indices=indices([7, 8, 9, 10]), keys=keys)])
    assert got == {PoolName.MAMBA: [True], PoolName.SWA: [True, True],
                   PoolName.INDEXER: [True] * 4}
    for s_page, d_page in zip([1, 2, 3, 4], [7, 8, 9, 10]):
        for name in (PoolName.KV, PoolName.INDEXER):
            assert torch.equal(page_kv(dst[name], d_page).view(torch.int16),
                               page_kv(src[name], s_page).view(torch.int16))
    for s_page, d_page in zip([3, 4], [11, 12]):
        assert torch.equal(page_kv(dst[PoolName.SWA], d_page).view(torch.int16),
                           page_kv(src[PoolName.SWA], s_page).view(torch.int16))
    assert torch.equal(mamba_state(dst[PoolName.MAMBA], 2), mamba_state(src[PoolName.MAMBA], 5))
    assert not mamba_state(dst[PoolName.MAMBA], 5).any()  # nothing written elsewhere


def test_a_missing_auxiliary_page_shortens_the_hit(kvtierd: KvtierdProcess) -> None:
    s, _ = hybrid(kvtierd.socket, seed=50)
    keys = page_keys(6, "short")
    assert s.batch_set_v1(keys, indices(list(range(6)))) == [True] * 6
    # The indexer holds pages 1..4 only; Mamba states exist at the ends of pages 3 and 6.
    assert s.batch_set_v2([PoolTransfer(PoolName.INDEXER, host_indices=indices([0, 1, 2, 3]),
                                        keys=keys[:4])])[PoolName.INDEXER] == [True] * 4
    for slot, page in ((0, 2), (1, 5)):
        assert s.batch_set_v2([PoolTransfer(PoolName.MAMBA, host_indices=slots([slot]),
                                            keys=[keys[page]], hit_policy=TRAILING)]
                              )[PoolName.MAMBA] == [True]
    mamba = PoolTransfer(PoolName.MAMBA, keys=keys[5:], hit_policy=TRAILING)
    indexer = PoolTransfer(PoolName.INDEXER, keys=keys, hit_policy=ALL)
    only_mamba = s.batch_exists_v2(keys, [mamba])
    assert only_mamba.kv_hit_pages == 6 and only_mamba.restorable_prefix_pages == [3, 6]
    both = s.batch_exists_v2(keys, [mamba, indexer])
    assert both.kv_hit_pages == 3 and both.restorable_prefix_pages == [3]
    assert both.extra_pool_hit_pages[PoolName.KV] == 6
    assert both.extra_pool_hit_pages[PoolName.INDEXER] == 4
    assert both.extra_pool_hit_pages[PoolName.MAMBA] == 6
    # A two-page window (SWA) with only the pages 5 and 6 stored: only the span's end works.
    assert s.batch_set_v2([PoolTransfer(PoolName.SWA, host_indices=indices([4, 5]),
                                        keys=keys[4:])])[PoolName.SWA] == [True, True]
    swa = s.batch_exists_v2(keys, [PoolTransfer(PoolName.SWA, keys=keys[4:],
                                                hit_policy=TRAILING)])
    assert swa.kv_hit_pages == 6 and swa.restorable_prefix_pages == [6]
    # The KV run itself bounds every pool: a span whose 4th KV page is unknown.
    other = keys[:3] + page_keys(3, "unknown")
    assert s.batch_exists_v2(other, [mamba]).restorable_prefix_pages == [3]


def test_pools_never_serve_each_others_pages(kvtierd: KvtierdProcess) -> None:
    s, _ = hybrid(kvtierd.socket, seed=60)
    keys = page_keys(2, "apart")
    assert s.batch_set_v2([PoolTransfer(PoolName.SWA, host_indices=indices([0, 1]),
                                        keys=keys)])[PoolName.SWA] == [True, True]
    assert s.batch_exists(keys) == 0  # not KV pages
    assert s.batch_get_v1(keys, indices([5, 6])) == [False, False]
    got = s.batch_get_v2([PoolTransfer(PoolName.INDEXER, host_indices=indices([5, 6]),
                                       keys=keys),
                          PoolTransfer(PoolName.MAMBA, host_indices=slots([3]), keys=keys[1:])])
    assert got == {PoolName.INDEXER: [False, False], PoolName.MAMBA: [False]}
    # Mamba state with another dtype is another namespace: its bytes would not fit.
    assert s.batch_set_v2([PoolTransfer(PoolName.MAMBA, host_indices=slots([0]),
                                        keys=keys[:1])])[PoolName.MAMBA] == [True]
    other = storage(kvtierd.socket, host_pool("page_first", seed=None))
    other.register_mem_host_pool_v2(mamba_pool(None, temporal_dtype=torch.bfloat16),
                                    PoolName.MAMBA)
    assert other.batch_get_v2([PoolTransfer(PoolName.MAMBA, host_indices=slots([0]),
                                            keys=keys[:1])])[PoolName.MAMBA] == [False]
    # A pool SGLang never registered: misses, no crash.
    assert s.batch_get_v2([PoolTransfer(PoolName.DRAFT, host_indices=indices([5]),
                                        keys=keys[:1])]) == {PoolName.DRAFT: [False]}
    assert s.batch_exists_v2(keys[:1], [PoolTransfer(PoolName.DRAFT, keys=keys[:1])]
                             ).kv_hit_pages == 0
    # clear() drops the auxiliary pools' pages too.
    assert s.clear() is True
    assert s.batch_get_v2([PoolTransfer(PoolName.SWA, host_indices=indices([5, 6]),
                                        keys=keys)])[PoolName.SWA] == [False, False]


@pytest.mark.parametrize("layout", ["layer_first", "page_first", "page_first_direct",
                                    "page_head", "page_unified"])
def test_every_mha_host_layout_round_trips(kvtierd: KvtierdProcess, layout: str) -> None:
    """Each layout stores pages another layout loads bit for bit: kvtier keeps one payload
    order, so the namespace does not depend on SGLang's host layout."""
    other = "page_head" if layout == "layer_first" else "layer_first"
    src, dst, back = host_pool(layout, seed=70), host_pool(other, seed=None), \
        host_pool(layout, seed=None)
    keys = page_keys(3, f"layout-{layout}")
    assert storage(kvtierd.socket, src).batch_set_v1(keys, indices([4, 0, 9])) == [True] * 3
    assert storage(kvtierd.socket, dst).batch_get_v1(keys, indices([1, 2, 3])) == [True] * 3
    assert storage(kvtierd.socket, back).batch_get_v1(keys, indices([5, 6, 7])) == [True] * 3
    for s_page, d_page, b_page in zip([4, 0, 9], [1, 2, 3], [5, 6, 7]):
        want = page_kv(src, s_page).view(torch.int16)
        assert torch.equal(page_kv(dst, d_page).view(torch.int16), want)
        assert torch.equal(page_kv(back, b_page).view(torch.int16), want)
    assert not page_kv(back, 4).any()


@pytest.mark.parametrize("layout", ["page_first_direct", "page_unified"])
def test_every_mla_host_layout_round_trips(kvtierd: KvtierdProcess, layout: str) -> None:
    src, dst = mla_pool(layout, seed=80), mla_pool("layer_first", seed=None)
    keys = page_keys(2, f"mla-{layout}")
    assert storage(kvtierd.socket, src, mla=True).batch_set_v1(keys, indices([3, 8])) == \
        [True, True]
    assert storage(kvtierd.socket, dst, mla=True).batch_get_v1(keys, indices([0, 1])) == \
        [True, True]
    for s_page, d_page in zip([3, 8], [0, 1]):
        assert torch.equal(page_kv(dst, d_page).view(torch.int16),
                           page_kv(src, s_page).view(torch.int16))


@pytest.mark.parametrize("layout", ["page_first", "page_first_direct"])
def test_every_mamba_host_layout_round_trips(kvtierd: KvtierdProcess, layout: str) -> None:
    src, dst = mamba_pool(seed=85, layout=layout), mamba_pool(seed=None, layout=layout)
    keys = page_keys(2, f"mamba-{layout}")
    a = storage(kvtierd.socket, host_pool("layer_first", seed=None))
    b = storage(kvtierd.socket, host_pool("layer_first", seed=None))
    a.register_mem_host_pool_v2(src, PoolName.MAMBA)
    b.register_mem_host_pool_v2(dst, PoolName.MAMBA)
    assert a.batch_set_v2([PoolTransfer(PoolName.MAMBA, host_indices=slots([6, 2]),
                                        keys=keys)])[PoolName.MAMBA] == [True, True]
    assert b.batch_get_v2([PoolTransfer(PoolName.MAMBA, host_indices=slots([0, 9]),
                                        keys=keys)])[PoolName.MAMBA] == [True, True]
    assert torch.equal(mamba_state(dst, 0), mamba_state(src, 6))
    assert torch.equal(mamba_state(dst, 9), mamba_state(src, 2))


def test_page_unified_with_head_groups_is_refused(kvtierd: KvtierdProcess) -> None:
    with pytest.raises(ValueError, match="head groups"):
        storage(kvtierd.socket, host_pool("page_unified", seed=None, head_groups=2))


def test_context_parallel_ranks_keep_their_own_pages(kvtierd: KvtierdProcess) -> None:
    """Under attention context parallelism each CP rank holds its own slice of every page."""
    pools = [host_pool("layer_first", seed=90 + r) for r in range(2)]
    ranks = [storage(kvtierd.socket, pools[r], cp=(r, 2)) for r in range(2)]
    keys = page_keys(2, "cp")
    for r in range(2):
        assert ranks[r].batch_set_v1(keys, indices([0, 1])) == [True, True]
    for r in range(2):
        dst = host_pool("layer_first", seed=None)
        assert storage(kvtierd.socket, dst, cp=(r, 2)).batch_get_v1(keys, indices([2, 3])) == \
            [True, True]
        assert torch.equal(page_kv(dst, 3), page_kv(pools[r], 1))
    assert storage(kvtierd.socket, host_pool("layer_first", seed=None)).batch_exists(keys) == 0


def test_dcp_shards_are_shared_across_dcp_groups_only(kvtierd: KvtierdProcess) -> None:
    """MLA with decode context parallelism: DCP rank d's shard is written by TP rank d and
    read by every TP rank of DCP rank d (SGLang's is_storage_writer)."""
    cfg = dict(mla=True, tp_size=4, logical_page=2 * PAGE)
    pools = [mla_pool("layer_first", seed=100 + d) for d in range(2)]
    writers = [storage(kvtierd.socket, pools[d], tp_rank=d, dcp=(d, 2), **cfg) for d in range(2)]
    keys = page_keys(2, "dcp")
    for d in range(2):
        assert writers[d].batch_set_v1(keys, indices([0, 1])) == [True, True]
    for d in range(2):
        dst = mla_pool("layer_first", seed=None)
        reader = storage(kvtierd.socket, dst, tp_rank=2 + d, dcp=(d, 2), **cfg)
        assert reader.batch_get_v1(keys, indices([4, 5])) == [True, True]
        assert torch.equal(page_kv(dst, 5), page_kv(pools[d], 1))
    assert storage(kvtierd.socket, mla_pool("layer_first", seed=None), mla=True,
                   tp_size=4).batch_exists(keys) == 0


def test_data_parallel_replicas_share_pages(kvtierd: KvtierdProcess) -> None:
    """DP attention: tp_rank is the rank inside the attention group, whose heads every DP
    replica holds alike, so one replica loads another's pages."""
    src = host_pool("layer_first", seed=110)
    keys = page_keys(2, "dp")
    assert storage(kvtierd.socket, src, dp_rank=0).batch_set_v1(keys, indices([0, 1])) == \
        [True, True]
    dst = host_pool("layer_first", seed=None)
    assert storage(kvtierd.socket, dst, dp_rank=1).batch_get_v1(keys, indices([2, 3])) == \
        [True, True]
    assert torch.equal(page_kv(dst, 3), page_kv(src, 1))


def test_mamba_state_stays_per_rank_in_an_mla_model(kvtierd: KvtierdProcess) -> None:
    """MLA KV is one copy for all TP ranks, but Mamba state is sharded by TP rank (SGLang backs
    it up on every rank)."""
    states = [mamba_pool(seed=120 + r) for r in range(2)]
    keys = page_keys(1, "mla-mamba")
    for r in range(2):
        s = storage(kvtierd.socket, mla_pool("layer_first", seed=None), tp_rank=r, tp_size=2,
                    mla=True)
        s.register_mem_host_pool_v2(states[r], PoolName.MAMBA)
        assert s.batch_set_v2([PoolTransfer(PoolName.MAMBA, host_indices=slots([4]),
                                            keys=keys)])[PoolName.MAMBA] == [True]
    for r in range(2):
        dst = mamba_pool(seed=None)
        s = storage(kvtierd.socket, mla_pool("layer_first", seed=None), tp_rank=r, tp_size=2,
                    mla=True)
        s.register_mem_host_pool_v2(dst, PoolName.MAMBA)
        assert s.batch_get_v2([PoolTransfer(PoolName.MAMBA, host_indices=slots([1]),
                                            keys=keys)])[PoolName.MAMBA] == [True]
        assert torch.equal(mamba_state(dst, 1), mamba_state(states[r], 4))


def test_every_base_class_call_is_implemented_or_raises(kvtierd: KvtierdProcess) -> None:
    """A call that returns None where SGLang expects a result ends its prefetch thread: every
    public method of the installed HiCacheStorage is overridden (the ones kvtier does not
    serve raise NotImplementedError), except the documented no-op hook."""
    hooks = {"on_host_pools_registered"}  # "backends that must finalize ... should do so here"
    for name, member in inspect.getmembers(HiCacheStorage, inspect.isfunction):
        if name.startswith("_") or name in hooks:
            continue
        assert getattr(KvtierStorage, name) is not member, f"{name} is the base class's"
    s = storage(kvtierd.socket, host_pool("layer_first", seed=None))
    for call in (lambda: s.get("k"), lambda: s.batch_get(["k"]), lambda: s.set("k"),
                 lambda: s.batch_set(["k"])):
        with pytest.raises(NotImplementedError):
            call()
