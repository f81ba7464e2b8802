"""kvtier under a real vLLM engine running a real model (a tiny random-weight Llama) on the CPU.

Every case compares the engine's greedy output with a cold recompute of the same prompt, and
reads ``num_cached_tokens`` (vLLM's own prefix cache is emptied before each request, so what it
counts came from kvtier) and kvtierd's stats, to show that the KV really came from kvtier.
A cold recompute is the same prompt under a cache salt used once: nothing in vLLM or kvtier is
keyed under it.

Engines (each start costs about a minute here): A runs the cases one after another; B (a
byte-identical copy of A's model in another folder) and C (another model with A's config and
model_id but other weights) then run at once beside the same kvtierd.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Iterator

import pytest

from kvtierd_process import KvtierdProcess, bin_dir
from real_engine import RealEngine, cold_salt, prompt
from tiny_llama import write_tiny_llama

CHUNK = 64  # kvtier chunk tokens: two of vLLM's 32-token CPU blocks
MODEL_ID = "tiny-llama"  # the same name for every engine: only the weights tell A and C apart
# One chunk's KV: 2 layers x (K and V) x 2 KV heads x 64 dims x 4 bytes (fp32) a token.
PAYLOAD_BYTES = CHUNK * 2 * 2 * 2 * 64 * 4
EXTRA = {"chunk_tokens": CHUNK, "model_id": MODEL_ID, "deadline_ms": 2000,
         "prefetch_deadline_ms": 2000}


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("models")
    a = write_tiny_llama(root / "a", seed=1)
    a_copy = root / "a-copy"
    shutil.copytree(a, a_copy)
    c = write_tiny_llama(root / "c", seed=2)
    return {"a": a, "a_copy": str(a_copy), "c": c}


@pytest.fixture(scope="module")
def daemon_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("kvtierd")


def start_kvtierd(workdir: Path) -> KvtierdProcess:
    (workdir / "nvme").mkdir(exist_ok=True)
    return KvtierdProcess(dram_bytes="256MiB", workdir=workdir,
                          extra_args=["--nvme-path", str(workdir / "nvme"),
                                      "--nvme-bytes", "256MiB"]).start()


@pytest.fixture(scope="module")
def state(daemon_dir: Path) -> Iterator[dict[str, KvtierdProcess]]:
    """The kvtierd the engines share (a test may restart it: the dict holds the current one)."""
    holder = {"kvtierd": start_kvtierd(daemon_dir)}
    yield holder
    holder["kvtierd"].stop()


@pytest.fixture(scope="module")
def engine_a(models: dict[str, str], state: dict[str, KvtierdProcess],
             tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealEngine]:
    logs = tmp_path_factory.mktemp("engine-a")
    engine = RealEngine(models["a"], logs / "engine.log", state["kvtierd"].socket, EXTRA,
                        num_blocks=48).wait_ready()
    yield engine
    engine.close()


def hit_tokens(daemon: KvtierdProcess) -> int:
    return int(daemon.admin().stats()["hit_tokens"])


def test_the_model_is_context_sensitive(engine_a: RealEngine) -> None:
    """Wrong KV must show in the output: one early token changed changes the greedy answer,
    and the answer is not one token repeated."""
    p = prompt(1, 200)
    changed = list(p)
    changed[3] = (changed[3] + 1) % 2048
    out, cached = engine_a.one(p, salt=cold_salt())
    out_changed, _ = engine_a.one(changed, salt=cold_salt())
    assert cached == 0
    assert out != out_changed
    assert len(set(out)) > 1


def test_a_prompt_stored_over_several_prefill_steps_loads_and_equals_cold(
        engine_a: RealEngine, state: dict[str, KvtierdProcess]) -> None:
    """A 300-token prompt prefills in three steps (128 tokens a step): every full chunk is
    stored, and the next request loads all of them and answers as cold recompute does."""
    p = prompt(2, 300)
    cold, _ = engine_a.one(p, salt=cold_salt())
    first, cached_first = engine_a.one(p)
    assert cached_first == 0 and first == cold
    before = hit_tokens(state["kvtierd"])
    again, cached = engine_a.one(p)
    assert cached == (300 // CHUNK) * CHUNK  # 256: four chunks, the tail recomputed
    assert again == cold
    assert hit_tokens(state["kvtierd"]) - before >= cached


def test_a_partial_hit_equals_cold(engine_a: RealEngine) -> None:
    p = prompt(2, 300)  # stored by the test before (or now)
    engine_a.one(p)
    q = p[:200] + prompt(3, 90)
    cold, _ = engine_a.one(q, salt=cold_salt())
    out, cached = engine_a.one(q)
    assert cached == (200 // CHUNK) * CHUNK  # the three chunks q shares with p
    assert out == cold


def test_chunks_the_engine_holds_count_as_no_kvtier_hits(
        engine_a: RealEngine, state: dict[str, KvtierdProcess]) -> None:
    """vLLM's own prefix cache holds the first two chunks, kvtier the next two: kvtierd counts
    only the two it served (its loader leases from chunk 0; issue 32, item 10)."""
    p = prompt(8, 300)
    cold, _ = engine_a.one(p, salt=cold_salt())
    engine_a.one(p)  # stored in kvtier
    # vLLM's prefix cache emptied, then refilled with p's first 128 tokens only.
    short = engine_a.generate([{"prompt": p[:140], "max_tokens": 1, "salt": None}])
    assert short["outputs"][0]["num_cached_tokens"] == 2 * CHUNK
    before = hit_tokens(state["kvtierd"])
    out = engine_a.generate([{"prompt": p, "max_tokens": 12, "salt": None}], reset=False)
    first = out["outputs"][0]
    assert first["num_cached_tokens"] == 4 * CHUNK  # two chunks vLLM's, two kvtier's
    assert first["tokens"] == cold
    assert hit_tokens(state["kvtierd"]) - before == 2 * CHUNK


def test_cache_salt_keeps_tenants_apart(engine_a: RealEngine) -> None:
    p = prompt(4, 256)
    engine_a.one(p, salt="tenant-a")
    _, cached_a = engine_a.one(p, salt="tenant-a")
    _, cached_b = engine_a.one(p, salt="tenant-b")
    assert cached_a > 0
    assert cached_b == 0


def test_chunks_lost_between_lookup_and_load_are_never_stored_wrong(
        engine_a: RealEngine, state: dict[str, KvtierdProcess]) -> None:
    """Issue 32 item 1. The scheduler counts a 160-token cached prefix; before the worker
    leases it, kvtierd loses it. vLLM recomputes; kvtier must not store the engine's stale
    blocks under the prefix's keys (nor what the step computed on them): later requests that
    load the prefix from kvtier answer as cold recompute does."""
    p = prompt(5, 230)
    cold, _ = engine_a.one(p, salt=cold_salt())
    engine_a.one(p)  # stored
    # Other requests' KV in the engine's blocks: the stale data a failed load leaves there.
    engine_a.generate([{"prompt": prompt(6, 300), "max_tokens": 4}])
    assert engine_a.call({"op": "evict_before_next_load", "wait_s": 3.0})["armed"]
    faulty = engine_a.generate([{"prompt": p, "max_tokens": 12}])
    assert faulty["fault"]["evicted"] > 0, "the fault did not run"
    assert faulty["outputs"][0]["tokens"] == cold  # vLLM recomputed the lost blocks
    for _ in range(2):
        out, cached = engine_a.one(p)
        assert cached == (230 // CHUNK) * CHUNK, "the prefix was not stored again"
        assert out == cold, "kvtier served KV that the engine computed on a failed load"


def test_preemption_under_a_small_kv_space_equals_cold(engine_a: RealEngine) -> None:
    """48 blocks of 32 tokens; four 200-token prompts decoding 250 tokens each need 15 blocks
    each at the end, 60 in all: vLLM preempts and resumes requests (loading from kvtier what it
    dropped)."""
    prompts = [prompt(10 + i, 200) for i in range(4)]
    colds = [engine_a.one(p, max_tokens=250, salt=cold_salt())[0] for p in prompts]
    out = engine_a.generate([{"prompt": p, "max_tokens": 250} for p in prompts])
    assert out["preemptions"] > 0, "no request was preempted: the case tests nothing"
    assert [o["tokens"] for o in out["outputs"]] == colds
    again = engine_a.generate([{"prompt": p, "max_tokens": 250} for p in prompts])
    assert [o["tokens"] for o in again["outputs"]] == colds
    assert all(o["num_cached_tokens"] >= 3 * CHUNK for o in again["outputs"])


def test_kvtierd_killed_and_restarted_serves_from_nvme(
        engine_a: RealEngine, state: dict[str, KvtierdProcess], daemon_dir: Path) -> None:
    p = prompt(20, 260)
    cold, _ = engine_a.one(p, salt=cold_salt())
    engine_a.one(p)
    subprocess.run([str(bin_dir() / "kvtierctl"), "--socket", state["kvtierd"].socket, "flush",
                    "--timeout", "60"], check=True, capture_output=True)
    state["kvtierd"].kill9()
    state["kvtierd"] = start_kvtierd(daemon_dir)
    out, cached = engine_a.one(p)
    assert cached == (260 // CHUNK) * CHUNK
    assert out == cold
    stats = state["kvtierd"].admin().stats()
    nvme = next(t for t in stats["tiers"] if t["name"] == "nvme")
    # DRAM was empty after the restart: the prefix was read back from the NVMe slot file.
    assert nvme["read_bytes"] >= (260 // CHUNK) * PAYLOAD_BYTES, json.dumps(stats)
    # The scheduler's prefetch promoted it; the worker (a session of its own) took that ticket
    # over (issue 32 item 10): the chunks count as NVMe hits, the ticket as used, and nothing
    # stays pinned for the ticket's deadline once the request is done.
    assert nvme["hits"] == 260 // CHUNK, json.dumps(stats)
    outcomes = stats["prefetches"]
    assert outcomes["used"] + outcomes["used_early"] == 1, json.dumps(outcomes)
    assert stats["active_prefetches"] == 0 and stats["active_leases"] == 0, json.dumps(stats)
    evicted = subprocess.run([str(bin_dir() / "kvtierctl"), "--socket", state["kvtierd"].socket,
                              "--json", "evict", "--all"], check=True, capture_output=True,
                             text=True)
    assert all(t["kept"] == 0 for t in json.loads(evicted.stdout)["tiers"]), evicted.stdout


def test_two_engines_at_once_share_only_same_weights(
        engine_a: RealEngine, models: dict[str, str], state: dict[str, KvtierdProcess],
        tmp_path_factory: pytest.TempPathFactory) -> None:
    """Engine B (a byte-identical copy of A's model, another folder) and engine C (A's config
    and model_id, other weights) run at the same time. B loads what A stored and answers as A's
    cold recompute; C finds nothing of A's (issue 32 item 3: same model_id, other weights) and
    answers as its own cold recompute."""
    p = prompt(30, 300)
    cold_a, _ = engine_a.one(p, salt=cold_salt())
    engine_a.one(p)
    engine_a.close()  # its memory and cores go to B and C
    logs = tmp_path_factory.mktemp("engines-bc")
    socket = state["kvtierd"].socket
    b = RealEngine(models["a_copy"], logs / "b.log", socket, EXTRA)
    c = RealEngine(models["c"], logs / "c.log", socket, EXTRA)
    try:
        b.wait_ready()
        c.wait_ready()
        out_b, cached_b = b.one(p)
        out_c, cached_c = c.one(p)
        cold_c, _ = c.one(p, salt=cold_salt())
        assert cached_b == (300 // CHUNK) * CHUNK and out_b == cold_a
        assert cached_c == 0, "an engine with other weights loaded A's KV"
        assert out_c == cold_c
        assert cold_c != cold_a  # the weights differ in what they answer
        # reset_prefix_cache(reset_connector=True), as after updating weights in place: B is
        # served nothing kvtier held before, and what it computes after is served again.
        reset = b.generate([{"prompt": p, "max_tokens": 12, "salt": None}],
                           reset_connector=True)["outputs"][0]
        assert reset["num_cached_tokens"] == 0, "served KV stored before the connector reset"
        assert reset["tokens"] == cold_a
        out_b, cached_b = b.one(p)
        assert cached_b == (300 // CHUNK) * CHUNK and out_b == cold_a
    finally:
        b.close()
        c.close()
