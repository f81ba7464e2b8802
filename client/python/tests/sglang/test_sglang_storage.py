"""KvtierStorage against the real sglang package: SGLang's MHATokenToKVPoolHost on CPU,
HiCacheStorageConfig, and a real kvtierd."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import kvtier
from kvtierd_process import KvtierdProcess
from sglang_pools import host_pool, indices, mla_pool, page_keys, page_kv, storage


@pytest.mark.parametrize("layout", ["layer_first", "page_first"])
def test_batch_round_trip_is_bit_exact(kvtierd: KvtierdProcess, layout: str) -> None:
    src_pool, dst_pool = host_pool(layout, seed=1), host_pool(layout, seed=None)
    a, b = storage(kvtierd.socket, src_pool), storage(kvtierd.socket, dst_pool)
    keys = page_keys(4, "doc")
    src_pages, dst_pages = [2, 5, 7, 9], [1, 3, 4, 8]
    assert a.batch_set_v1(keys, indices(src_pages)) == [True] * 4
    assert b.batch_exists(keys) == 4
    assert b.batch_get_v1(keys, indices(dst_pages)) == [True] * 4
    for s, d in zip(src_pages, dst_pages):
        assert torch.equal(page_kv(dst_pool, d).view(torch.int16),
                           page_kv(src_pool, s).view(torch.int16))
    assert not page_kv(dst_pool, 2).any()  # nothing written outside the given pages
    assert a.batch_set_v1(keys, indices(src_pages)) == [True] * 4  # already stored: fine


def test_existence_is_the_leading_run(kvtierd: KvtierdProcess) -> None:
    pool = host_pool("layer_first", seed=2)
    s = storage(kvtierd.socket, pool)
    keys = page_keys(4, "run")
    assert s.batch_set_v1(keys[:2], indices([0, 1])) == [True, True]
    assert s.batch_exists(keys) == 2
    assert s.batch_exists(keys[2:]) == 0
    assert s.batch_exists([keys[0], page_keys(1, "other")[0], keys[1]]) == 1
    got = s.batch_get_v1(keys, indices([10, 11, 12, 13]))
    assert got == [True, True, False, False]
    # A hash that shares its first 16 bytes with a stored page is a miss.
    forged = keys[0][:32] + "0" * 32
    assert s.batch_exists([forged]) == 0
    assert s.batch_get_v1([forged], indices([14])) == [False]


def test_a_request_counts_its_prompt_and_hits_once(kvtierd: KvtierdProcess) -> None:
    """SGLang's storage calls carry no request id (issue 32 item 10): the backend names the
    request of each storage query, so kvtierd counts a prompt once across its batch_exists,
    batch_get_v1 and the lookup after its batch_set_v1, and two queued requests that share
    pages each count theirs."""
    s = storage(kvtierd.socket, host_pool("layer_first", seed=30))
    admin = kvtierd.admin()

    def counts() -> tuple[int, int]:
        stats = admin.stats()
        return int(stats["lookup_tokens"]), int(stats["hit_tokens"])

    keys = page_keys(4, "once")
    start = counts()
    assert s.batch_exists(keys) == 0  # a new prompt: queried, a miss, then backed up
    queried = counts()
    prompt_tokens = queried[0] - start[0]
    assert prompt_tokens > 0 and queried[1] == start[1]
    assert s.batch_set_v1(keys, indices([0, 1, 2, 3])) == [True] * 4
    assert counts() == queried, "the lookup after the store counted the prompt again"
    # Two requests with these pages queued, then each loads them: two prompts, each served.
    assert s.batch_exists(keys) == 4
    assert s.batch_exists(keys) == 4
    assert s.batch_get_v1(keys, indices([4, 5, 6, 7])) == [True] * 4
    assert s.batch_get_v1(keys, indices([8, 9, 10, 11])) == [True] * 4
    end = counts()
    assert end[0] - queried[0] == 2 * prompt_tokens
    assert end[1] - queried[1] == 2 * prompt_tokens


def test_tp_ranks_keep_their_own_pages_on_one_daemon(kvtierd: KvtierdProcess) -> None:
    pools = [host_pool("layer_first", seed=10 + r) for r in range(2)]
    ranks = [storage(kvtierd.socket, pools[r], tp_rank=r, tp_size=2) for r in range(2)]
    keys = page_keys(3, "tp")
    for r in range(2):
        assert ranks[r].batch_set_v1(keys, indices([0, 1, 2])) == [True] * 3
    for r in range(2):
        dst = host_pool("layer_first", seed=None)
        reader = storage(kvtierd.socket, dst, tp_rank=r, tp_size=2)
        assert reader.batch_get_v1(keys, indices([4, 5, 6])) == [True] * 3
        assert torch.equal(page_kv(dst, 5), page_kv(pools[r], 1))  # its own rank's heads
    solo = storage(kvtierd.socket, host_pool("layer_first", seed=None))  # tp 0 of 1
    assert solo.batch_exists(keys) == 0


@pytest.mark.parametrize("layout", ["layer_first", "page_first"])
def test_mla_keeps_one_copy_shared_by_every_tp_rank(kvtierd: KvtierdProcess, layout: str) -> None:
    pools = [mla_pool(layout, seed=20), mla_pool(layout, seed=21)]
    ranks = [storage(kvtierd.socket, pools[r], tp_rank=r, tp_size=2, mla=True) for r in range(2)]
    keys = page_keys(3, "mla")
    assert ranks[0].batch_set_v1(keys, indices([0, 1, 2])) == [True] * 3
    written = kvtierd.admin().stats()["tiers"][0]["write_bytes"]
    assert ranks[1].batch_set_v1(keys, indices([0, 1, 2])) == [True] * 3  # not the writer
    assert kvtierd.admin().stats()["tiers"][0]["write_bytes"] == written
    dst = mla_pool(layout, seed=None)
    reader = storage(kvtierd.socket, dst, tp_rank=1, tp_size=2, mla=True)
    assert reader.batch_exists(keys) == 3
    assert reader.batch_get_v1(keys, indices([7, 8, 9])) == [True] * 3
    for s_page, d_page in zip([0, 1, 2], [7, 8, 9]):
        assert torch.equal(page_kv(dst, d_page).view(torch.int16),
                           page_kv(pools[0], s_page).view(torch.int16))


def test_a_page_stored_by_one_process_is_loaded_by_another(kvtierd: KvtierdProcess,
                                                           tmp_path: Path) -> None:
    pool = host_pool("page_first", seed=3)
    keys = page_keys(2, "xproc")
    assert storage(kvtierd.socket, pool).batch_set_v1(keys, indices([6, 3])) == [True, True]
    torch.save(torch.stack([page_kv(pool, 6), page_kv(pool, 3)]), tmp_path / "want.pt")
    script = textwrap.dedent(f"""
        import sys, torch
        sys.path[:0] = {sys.path[:3]!r}
        from sglang_pools import host_pool, indices, page_kv, storage
        pool = host_pool("layer_first", seed=None)
        s = storage({kvtierd.socket!r}, pool)
        assert s.batch_get_v1({keys!r}, indices([0, 1])) == [True, True]
        want = torch.load({str(tmp_path / "want.pt")!r})
        got = torch.stack([page_kv(pool, 0), page_kv(pool, 1)])
        assert torch.equal(got.view(torch.int16), want.view(torch.int16))
        print("LOADED-BIT-EXACT")
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=300, env=dict(os.environ))
    assert "LOADED-BIT-EXACT" in out.stdout, out.stdout + out.stderr


def test_storage_metrics_and_daemon_down(kvtierd: KvtierdProcess) -> None:
    pool = host_pool("layer_first", seed=4)
    s = storage(kvtierd.socket, pool, metrics=True)
    keys = page_keys(2, "metrics")
    s.batch_set_v1(keys, indices([0, 1]))
    s.batch_get_v1(keys, indices([2, 3]))
    stats = s.get_stats()
    assert stats.backup_pgs == [2] and stats.prefetch_pgs == [2]
    assert s.get_stats().backup_pgs == []  # reset by each call
    kvtierd.kill9()
    assert s.batch_exists(keys) == 0  # a miss, not an error
    assert s.batch_get_v1(keys, indices([4, 5])) == [False, False]
    assert s.batch_set_v1(keys, indices([0, 1])) == [False, False]


def test_clear_drops_this_backends_pages_only(kvtierd: KvtierdProcess) -> None:
    mine = storage(kvtierd.socket, host_pool("layer_first", seed=6))
    other = storage(kvtierd.socket, host_pool("layer_first", seed=7), tp_rank=1, tp_size=2)
    keys = page_keys(3, "clear")
    assert mine.batch_set_v1(keys, indices([0, 1, 2])) == [True] * 3
    assert other.batch_set_v1(keys, indices([0, 1, 2])) == [True] * 3
    assert mine.clear() is True
    assert mine.batch_exists(keys) == 0
    assert mine.batch_get_v1(keys, indices([4, 5, 6])) == [False] * 3
    assert other.batch_exists(keys) == 3  # another TP rank's namespace
    assert mine.batch_set_v1(keys, indices([0, 1, 2])) == [True] * 3  # stored again later
    assert mine.batch_exists(keys) == 3
    kvtierd.kill9()
    assert mine.clear() is False  # unreachable: logged, not raised


def test_host_indices_that_are_not_whole_pages_are_refused(kvtierd: KvtierdProcess) -> None:
    pool = host_pool("layer_first", seed=5)
    s = storage(kvtierd.socket, pool)
    keys = page_keys(2, "bad-indices")
    before = pool.kv_buffer.clone()
    shifted = indices([1, 2]) + 3  # not page-aligned
    assert s.batch_set_v1(keys, shifted) == [False, False]
    assert s.batch_get_v1(keys, shifted) == [False, False]
    assert s.batch_get_v1(keys, indices([1])) == [False, False]  # one page for two keys
    assert s.batch_get_v1(keys[:1], indices([1]) - 2 * 16) == [False]  # before the pool
    assert s.batch_exists(keys) == 0 and torch.equal(pool.kv_buffer, before)


def test_bad_configurations_are_refused(kvtierd: KvtierdProcess) -> None:
    pool = host_pool("layer_first", seed=None)
    with pytest.raises(ValueError, match="interface_v1"):
        storage(kvtierd.socket, pool, interface_v1=0)
    with pytest.raises(ValueError, match="unknown hicache storage extra config keys"):
        storage(kvtierd.socket, pool, sokcet="/tmp/x")
    with pytest.raises(ValueError, match="deadline_ms must be an integer"):
        storage(kvtierd.socket, pool, deadline_ms="abc")
    for bad in (0, -5):
        with pytest.raises(ValueError, match=f"deadline_ms must be positive, not {bad}"):
            storage(kvtierd.socket, pool, deadline_ms=bad)
    # SGLang itself reads interface_v1 as bool(...): JSON's true turns the zero-copy calls on.
    assert storage(kvtierd.socket, pool, interface_v1=True)._ready() is not None
    with pytest.raises(ValueError, match="pp_size 2 is not supported"):
        storage(kvtierd.socket, pool, pp=(1, 2))
    # fp8 KV: SGLang's host pool holds uint8; the extra config says which fp8.
    fp8 = host_pool("layer_first", seed=None, dtype=torch.uint8)
    with pytest.raises(ValueError, match="kv_dtype"):
        storage(kvtierd.socket, fp8)
    assert storage(kvtierd.socket, fp8, kv_dtype="fp8_e5m2")._ready().kv_dtype == "fp8_e5m2"
