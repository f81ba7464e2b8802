"""kvtier.Client against a real kvtierd: round trips, partial hits, fail-open, bad arguments,
threads, leases and reservations, prefetch, admin stats."""

from __future__ import annotations

import subprocess
import threading
import time
import unicodedata

import numpy as np
import pytest
import xxhash

import kvtier
from kvtierd_process import KvtierdProcess, bin_dir

CHUNK = 16  # tokens per chunk in these tests


def open_ns(client: kvtier.Client, **kw: object) -> kvtier.Namespace:
    spec: dict[str, object] = dict(model_id="test/tiny", num_layers=2, kv_dtype="float16",
                                   num_kv_heads=2, head_dim=8, chunk_tokens=CHUNK)
    spec.update(kw)
    return client.open_namespace(**spec)  # type: ignore[arg-type]


def payloads(ns: kvtier.Namespace, num_chunks: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, size=num_chunks * ns.payload_bytes, dtype=np.uint8)


def prompt(seed: int, length: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 128_000, size=length, dtype=np.int32)


def connect(daemon: KvtierdProcess, deadline_ms: int = 1000) -> kvtier.Client:
    return kvtier.Client.connect(socket=daemon.socket, deadline_ms=deadline_ms)


def test_payload_bytes_follow_the_namespace_shape(kvtierd: KvtierdProcess) -> None:
    with connect(kvtierd) as c:
        ns = open_ns(c)
        # [layers][K,V][chunk_tokens][heads][head_dim] fp16
        assert ns.payload_bytes == 2 * 2 * CHUNK * 2 * 8 * 2
        assert ns.layer_bytes == ns.payload_bytes // 2
        assert ns.kv_dtype == "fp16" and ns.chunk_tokens == CHUNK


def test_chunk_keys_match_an_independent_xxh3_implementation(kvtierd: KvtierdProcess) -> None:
    with connect(kvtierd) as c:
        ns = open_ns(c, cache_salt="tenant-a")
        tokens = prompt(1, 3 * CHUNK + 5)
        canonical = ("kvtier/v1|model=test/tiny|lora=|dtype=fp16|layout=mha|layers=2|"
                     f"kv_heads=2|head_dim=8|latent_dim=0|chunk_tokens={CHUNK}|tp_rank=0|"
                     "tp_size=1|salt=tenant-a")
        parent = xxhash.xxh3_128_intdigest(canonical.encode()).to_bytes(16, "little")
        assert ns.id == xxhash.xxh3_128_hexdigest(canonical.encode())
        # The salt is hashed in but never shown: repr() ends up in engines' logs.
        assert "tenant-a" not in repr(ns) and "|salt=(set)" in repr(ns), repr(ns)
        expected = []
        for i in range(3):
            chunk = tokens[i * CHUNK:(i + 1) * CHUNK].astype("<i4").tobytes()
            parent = xxhash.xxh3_128_intdigest(parent + chunk).to_bytes(16, "little")
            expected.append(parent)
        assert kvtier.Client.chunk_keys(ns, tokens) == expected


def test_round_trip_is_bit_exact_into_numpy_and_bytearray(kvtierd: KvtierdProcess) -> None:
    with connect(kvtierd) as c:
        ns = open_ns(c)
        tokens = prompt(2, 3 * CHUNK + 7)  # 3 full chunks and a tail that is never stored
        data = payloads(ns, 3, seed=2)
        stored = c.store(ns, tokens, data)
        assert stored.fail_open is None
        assert (stored.stored_chunks, stored.stored_bytes) == (3, 3 * ns.payload_bytes)

        hit = c.lookup(ns, tokens)
        assert (hit.cached_tokens, hit.num_chunks, hit.fail_open) == (3 * CHUNK, 3, None)

        out = np.zeros_like(data)
        loaded = c.load(ns, tokens, out)
        assert (loaded.num_chunks, loaded.loaded_tokens) == (3, 3 * CHUNK)
        assert np.array_equal(out, data)

        buf = bytearray(3 * ns.payload_bytes)
        assert c.load(ns, tokens, buf).num_chunks == 3
        assert bytes(buf) == data.tobytes()

        again = c.store(ns, tokens, data)
        assert (again.stored_chunks, again.already_stored_chunks) == (0, 3)


def test_tokens_as_list_int32_and_int64_are_the_same_prompt(kvtierd: KvtierdProcess) -> None:
    with connect(kvtierd) as c:
        ns = open_ns(c)
        tokens = prompt(3, 2 * CHUNK)
        c.store(ns, tokens.tolist(), payloads(ns, 2, 3))
        for form in (tokens, tokens.astype(np.int64), tokens.tolist(), tuple(tokens.tolist()),
                     tokens.astype(np.int64)[::1]):
            assert c.lookup(ns, form).num_chunks == 2
        strided = np.repeat(tokens.astype(np.int64), 2)[::2]  # a non-contiguous view
        assert c.lookup(ns, strided).num_chunks == 2


def test_partial_hits_and_prompts_shorter_than_a_chunk(kvtierd: KvtierdProcess) -> None:
    with connect(kvtierd) as c:
        ns = open_ns(c)
        tokens = prompt(4, 4 * CHUNK)
        data = payloads(ns, 4, 4)
        c.store(ns, tokens[:2 * CHUNK], data[:2 * ns.payload_bytes])
        assert c.lookup(ns, tokens).cached_tokens == 2 * CHUNK

        out = np.zeros_like(data)
        loaded = c.load(ns, tokens, out)
        assert loaded.num_chunks == 2
        assert np.array_equal(out[:2 * ns.payload_bytes], data[:2 * ns.payload_bytes])
        assert not out[2 * ns.payload_bytes:].any()  # nothing written past the hit

        diverged = tokens.copy()
        diverged[CHUNK + 3] += 1  # differs inside chunk 1: only chunk 0 is shared
        assert c.lookup(ns, diverged).num_chunks == 1

        short = tokens[:CHUNK - 1]
        assert c.store(ns, short, b"").stored_chunks == 0
        assert c.lookup(ns, short).cached_tokens == 0
        assert c.load(ns, short, bytearray(ns.payload_bytes)).num_chunks == 0

        # out holds room for one chunk only: one is loaded
        assert c.load(ns, tokens, bytearray(ns.payload_bytes + 1)).num_chunks == 1


def test_namespaces_do_not_share_kv(kvtierd: KvtierdProcess) -> None:
    with connect(kvtierd) as c:
        a = open_ns(c, cache_salt="a")
        b = open_ns(c, cache_salt="b")
        tokens = prompt(5, CHUNK)
        c.store(a, tokens, payloads(a, 1, 5))
        assert c.lookup(a, tokens).num_chunks == 1
        assert c.lookup(b, tokens).num_chunks == 0


def _columns(text: str) -> int:
    """Terminal columns of `text`: 2 for wide East Asian characters, 0 for combining marks."""
    return sum(0 if unicodedata.combining(ch) else
               2 if unicodedata.east_asian_width(ch) in ("W", "F") else 1 for ch in text)


def test_kvtierctl_namespace_table_aligns_names_and_tells_lora_and_salt_apart(
        kvtierd: KvtierdProcess) -> None:
    """kvtierctl padded model ids by bytes (a non-ASCII one shifted every column after it)
    and showed neither LoRA adapter nor salt: two namespaces of one model looked alike."""
    with connect(kvtierd) as c:
        open_ns(c, model_id="\u6a21\u578b/m\u00fcnchen")
        open_ns(c, lora_id="adapter-7", cache_salt="tenant-b", kv_dtype="fp8_e4m3")
        open_ns(c)
    out = subprocess.run([str(bin_dir() / "kvtierctl"), "--socket", kvtierd.socket,
                          "namespaces"], capture_output=True, text=True, check=True).stdout
    header, *rows = out.splitlines()
    assert len(rows) == 3, out
    dtype_column = _columns(header[:header.index("dtype")])
    lay_column = _columns(header[:header.index("lay ")])
    for row in rows:
        dtype = "fp8_e4m3" if "adapter-7" in row else "fp16"
        assert _columns(row[:row.index(dtype)]) == dtype_column, out
        assert _columns(row[:row.index(" mha ") + 1]) == lay_column, out
    lora_column = _columns(header[:header.index("lora")])
    cells = {row.split()[1]: row for row in rows}
    assert "\u6a21\u578b/m\u00fcnchen" in cells, out
    tenant = [r for r in rows if "adapter-7" in r]
    assert len(tenant) == 1, out
    assert _columns(tenant[0][:tenant[0].index("adapter-7")]) == lora_column, out
    assert tenant[0].split()[3] == "set", out  # the salt column says a salt is set, not which
    assert "tenant-b" not in out
    plain = [r for r in rows if r.split()[1] == "test/tiny" and "adapter-7" not in r]
    assert len(plain) == 1 and plain[0].split()[2:4] == ["-", "-"], out


def test_engine_names_kvtier_cannot_hold_are_hashed_into_their_own_namespaces(
        kvtierd: KvtierdProcess) -> None:
    """The integrations' namespace_text: a salt or LoRA name with '|', a control character
    (C0, DEL, C1), a lone surrogate or over 512 bytes opens a namespace of its own, where
    kvtier itself refuses the raw value (a tenant with such a salt once ran uncached)."""
    from kvtier.integrations._names import namespace_text
    odd = ["tenant|a", "tenant\na", "tenant\x00a", "tenant\x7fa", "tenant\x85a",
           "tenant\udcffa", "t" * 513]
    with connect(kvtierd) as c:
        with pytest.raises(kvtier.InvalidArgument, match="cache_salt"):
            open_ns(c, cache_salt="tenant\na")
        ids = set()
        for salt in odd + ["tenant-a"]:
            text = namespace_text(salt)
            ns = open_ns(c, cache_salt=text)
            ids.add(ns.id)
            assert (text == salt) == (salt == "tenant-a"), salt
        assert len(ids) == len(odd) + 1


def test_bad_arguments_raise_and_change_nothing(kvtierd: KvtierdProcess) -> None:
    with connect(kvtierd) as c:
        ns = open_ns(c)
        tokens = prompt(6, 2 * CHUNK)
        data = payloads(ns, 2, 6)
        before = kvtierd.admin().stats()

        with pytest.raises(kvtier.InvalidArgument, match="num_layers"):
            open_ns(c, num_layers=0)
        # A negative or too large int raised nanobind's bare TypeError.
        with pytest.raises(kvtier.InvalidArgument, match="num_layers: -1 is negative"):
            open_ns(c, num_layers=-1)
        with pytest.raises(kvtier.InvalidArgument, match="head_dim: 4294967296 is more than"):
            open_ns(c, head_dim=2**32)
        with pytest.raises(kvtier.InvalidArgument, match="kv_dtype"):
            open_ns(c, kv_dtype="float64")
        with pytest.raises(kvtier.InvalidArgument, match="source holds"):
            c.store(ns, tokens, data[:-1])
        with pytest.raises(kvtier.InvalidArgument, match="tokens: item 3 is outside int32"):
            c.store(ns, [1, 2, 3, 2**31] + [0] * (2 * CHUNK - 4), data)
        with pytest.raises(kvtier.InvalidArgument, match="int32 or int64"):
            c.lookup(ns, tokens.astype(np.float32))
        with pytest.raises(kvtier.InvalidArgument, match="1 dimension"):
            c.lookup(ns, tokens.reshape(2, CHUNK))
        with pytest.raises(kvtier.InvalidArgument, match="not an int"):
            c.lookup(ns, ["a"] * CHUNK)
        with pytest.raises(kvtier.InvalidArgument, match="writable"):
            c.load(ns, tokens, bytes(len(data)))
        readonly = np.zeros_like(data)
        readonly.flags.writeable = False
        with pytest.raises(kvtier.InvalidArgument, match="writable"):
            c.load(ns, tokens, readonly)
        with pytest.raises(kvtier.InvalidArgument, match="C-contiguous"):
            c.load(ns, tokens, np.zeros(2 * len(data), dtype=np.uint8)[::2])
        with pytest.raises(kvtier.InvalidArgument, match="policy"):
            c.prefetch(ns, tokens, policy="eventually")
        with pytest.raises(kvtier.InvalidArgument):
            c.prefetch(ns, tokens, deadline_ms=0)
        with pytest.raises(kvtier.InvalidArgument):
            kvtier.Client.connect(socket=kvtierd.socket, deadline_ms=0)
        # A namespace this client did not open.
        with connect(kvtierd) as other:
            foreign = open_ns(other, model_id="test/other")
        with pytest.raises(kvtier.InvalidArgument):
            c.lookup(foreign, tokens)
        # InvalidArgument is also a ValueError, and every class derives from kvtier.Error.
        with pytest.raises(ValueError):
            c.lookup(ns, tokens.astype(np.float32))

        after = kvtierd.admin().stats()
        dram_before = [t for t in before["tiers"] if t["name"] == "dram"][0]
        dram_after = [t for t in after["tiers"] if t["name"] == "dram"][0]
        assert dram_after["chunks"] == dram_before["chunks"] == 0
        assert dram_after["write_bytes"] == dram_before["write_bytes"]
        assert after["active_reservations"] == 0
        assert c.lookup(ns, tokens).num_chunks == 0


def test_fail_open_while_the_daemon_is_down_then_reconnects(kvtierd: KvtierdProcess) -> None:
    c = kvtier.Client.connect(socket=kvtierd.socket, deadline_ms=200,
                              reconnect_interval_ms=50)
    ns = open_ns(c)
    tokens = prompt(7, 2 * CHUNK)
    data = payloads(ns, 2, 7)
    assert c.store(ns, tokens, data).stored_chunks == 2

    kvtierd.kill9()
    hit = c.lookup(ns, tokens)
    assert hit.num_chunks == 0 and hit.fail_open is not None
    out = np.zeros_like(data)
    loaded = c.load(ns, tokens, out)
    assert loaded.num_chunks == 0 and loaded.fail_open is not None and not out.any()
    dropped = c.store(ns, tokens, data)
    assert dropped.stored_chunks == 0 and dropped.fail_open is not None
    ticket = c.prefetch(ns, tokens)
    assert ticket.id == 0 and ticket.fail_open is not None

    kvtierd.start()  # a new daemon run: empty cache, new arena epoch
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and c.store(ns, tokens, data).stored_chunks != 2:
        time.sleep(0.1)
    assert c.load(ns, tokens, out).num_chunks == 2
    assert np.array_equal(out, data)
    c.close()


def test_daemon_killed_while_threads_load_never_yields_wrong_bytes(
        kvtierd: KvtierdProcess) -> None:
    c = kvtier.Client.connect(socket=kvtierd.socket, deadline_ms=200,
                              reconnect_interval_ms=50)
    ns = open_ns(c)
    tokens = prompt(8, 4 * CHUNK)
    data = payloads(ns, 4, 8)
    assert c.store(ns, tokens, data).stored_chunks == 4
    stop = threading.Event()
    outcomes: list[tuple[int, bool]] = []
    errors: list[BaseException] = []

    def loader() -> None:
        out = np.zeros_like(data)
        try:
            while not stop.is_set():
                out[:] = 0
                r = c.load(ns, tokens, out)
                n = r.num_chunks * ns.payload_bytes
                outcomes.append((r.num_chunks, bool(np.array_equal(out[:n], data[:n]))))
        except BaseException as e:  # noqa: BLE001 - any exception fails the test
            errors.append(e)

    threads = [threading.Thread(target=loader) for _ in range(3)]
    for t in threads:
        t.start()
    time.sleep(0.3)
    kvtierd.kill9()
    time.sleep(0.5)
    stop.set()
    for t in threads:
        t.join(timeout=30)
    assert not errors
    assert any(n == 4 for n, _ in outcomes)   # loads before the kill hit
    assert any(n == 0 for n, _ in outcomes)   # loads after it failed open
    assert all(ok for _, ok in outcomes)      # every byte reported valid was right
    c.close()


def test_gil_is_released_while_a_call_waits_on_the_daemon(kvtierd: KvtierdProcess) -> None:
    c = kvtier.Client.connect(socket=kvtierd.socket, deadline_ms=800)
    ns = open_ns(c)
    tokens = prompt(9, CHUNK)
    c.store(ns, tokens, payloads(ns, 1, 9))
    kvtierd.pause()  # the daemon stops answering: lookup waits out its deadline
    try:
        result: list[kvtier.LookupResult] = []
        t = threading.Thread(target=lambda: result.append(c.lookup(ns, tokens)))
        t.start()
        time.sleep(0.05)
        spins = 0
        begin = time.monotonic()
        while t.is_alive() and time.monotonic() - begin < 0.5:
            spins += 1  # runs only if the lookup thread let go of the GIL
        t.join(timeout=30)
        assert spins > 1000
        assert result and result[0].fail_open is not None
    finally:
        kvtierd.resume()
    c.close()


def test_threads_share_one_client(kvtierd: KvtierdProcess) -> None:
    with connect(kvtierd, deadline_ms=2000) as c:
        ns = open_ns(c)
        errors: list[str] = []

        def worker(w: int) -> None:
            for i in range(15):
                tokens = prompt(1000 * w + i, 2 * CHUNK)
                data = payloads(ns, 2, 1000 * w + i)
                s = c.store(ns, tokens, data)
                out = np.zeros_like(data)
                r = c.load(ns, tokens, out)
                if s.fail_open or r.num_chunks != 2 or not np.array_equal(out, data):
                    errors.append(f"worker {w} iteration {i}: {s.fail_open} {r.num_chunks}")

        threads = [threading.Thread(target=worker, args=(w,)) for w in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        assert not errors
        dram = [t for t in kvtierd.admin().stats()["tiers"] if t["name"] == "dram"][0]
        assert dram["chunks"] == 8 * 15 * 2


def test_reserve_and_acquire_as_context_managers(kvtierd: KvtierdProcess) -> None:
    with connect(kvtierd) as c:
        ns = open_ns(c)
        tokens = prompt(10, 3 * CHUNK)
        data = payloads(ns, 3, 10).reshape(3, ns.payload_bytes)

        with c.reserve(ns, tokens) as r:
            assert len(r) == 3
            for k in range(len(r)):
                r.write(r.chunk_index(k), data[r.chunk_index(k)])
            with pytest.raises(kvtier.InvalidArgument, match="k: reserved chunk 3"):
                r.chunk_index(3)
            with pytest.raises(kvtier.InvalidArgument, match="data: "):
                r.write(0, data[0][:-1])
            committed = r.commit()
            assert committed.stored_chunks == 3
            with pytest.raises(kvtier.FailedPrecondition):
                r.commit()
            # After commit the slots belong to the cache: no more writes through `r`.
            with pytest.raises(kvtier.FailedPrecondition):
                r.write(0, data[0])
        # A chunk left unwritten is never published (its slot may hold stale bytes).
        with c.reserve(ns, prompt(12, 2 * CHUNK)) as r:
            r.write(0, data[0])
            with pytest.raises(kvtier.FailedPrecondition, match="chunk 1 was not written"):
                r.commit()
            with pytest.raises(kvtier.InvalidArgument, match="k: -1 is negative"):
                r.write(-1, data[0])
        assert c.lookup(ns, prompt(12, 2 * CHUNK)).num_chunks == 0
        with pytest.raises(kvtier.InvalidArgument, match="first_chunk: -1 is negative"):
            c.reserve(ns, tokens, first_chunk=-1)
        with c.reserve(ns, prompt(11, CHUNK)) as r:
            r.write(0, np.ones(ns.payload_bytes, dtype=np.uint8))
        # left without commit: aborted, nothing visible, no more writes
        assert c.lookup(ns, prompt(11, CHUNK)).num_chunks == 0
        with pytest.raises(kvtier.FailedPrecondition):
            r.write(0, data[0])

        with c.acquire(ns, tokens) as lease:
            assert lease.num_chunks == 3
            out = np.zeros(ns.payload_bytes, dtype=np.uint8)
            for i in range(3):
                assert lease.read(i) == data[i].tobytes()
                lease.read(i, out)
                assert np.array_equal(out, data[i])
            assert lease.valid_chunks() == 3
            with pytest.raises(kvtier.InvalidArgument):
                lease.read(3)
            assert kvtierd.admin().stats()["active_leases"] > 0
        with pytest.raises(kvtier.FailedPrecondition):
            lease.read(0)  # released with the block
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and kvtierd.admin().stats()["active_leases"]:
            time.sleep(0.05)
        assert kvtierd.admin().stats()["active_leases"] == 0
        with c.acquire(ns, tokens, max_chunks=1) as lease:
            assert lease.num_chunks == 1


def test_prefetch_then_load_with_the_ticket(kvtierd: KvtierdProcess) -> None:
    with connect(kvtierd) as c:
        ns = open_ns(c)
        tokens = prompt(12, 2 * CHUNK)
        data = payloads(ns, 2, 12)
        c.store(ns, tokens, data)
        ticket = c.prefetch(ns, tokens, policy="wait_complete", deadline_ms=5000)
        assert ticket.fail_open is None and ticket.id != 0
        assert ticket.total_chunks == 2 and ticket.policy == "wait_complete"
        progress = c.prefetch_status(ticket)
        assert progress.done and progress.ready_chunks == 2
        out = np.zeros_like(data)
        loaded = c.load(ns, tokens, out, ticket=ticket)
        assert loaded.num_chunks == 2 and np.array_equal(out, data)
        miss = c.prefetch(ns, prompt(13, 2 * CHUNK))
        assert miss.total_chunks == 0


def test_admin_stats_count_what_was_stored_and_hit(kvtierd: KvtierdProcess) -> None:
    admin = kvtierd.admin()
    assert admin.health()["serving"]
    with connect(kvtierd) as c:
        ns = open_ns(c)
        tokens = prompt(14, 2 * CHUNK + 3)
        c.store(ns, tokens, payloads(ns, 2, 14))
        before = admin.stats()
        # One engine request: the scheduler's lookup, then the worker's load.
        assert c.lookup(ns, tokens, request_id="req-14").num_chunks == 2
        after_lookup = admin.stats()
        out = np.zeros(2 * ns.payload_bytes, dtype=np.uint8)
        assert c.load(ns, tokens, out, request_id="req-14").num_chunks == 2
        stats = admin.stats()
        dram = [t for t in stats["tiers"] if t["name"] == "dram"][0]
        assert dram["chunks"] == 2
        assert dram["write_bytes"] == 2 * ns.payload_bytes
        assert after_lookup["hit_tokens"] == before["hit_tokens"], "a lookup serves nothing"
        assert stats["lookup_tokens"] - before["lookup_tokens"] == len(tokens)
        assert stats["hit_tokens"] - before["hit_tokens"] == 2 * CHUNK
        with pytest.raises(kvtier.InvalidArgument, match="request_id is 257 bytes"):
            c.lookup(ns, tokens, request_id="r" * 257)
        assert stats["sessions"] >= 1
        assert any(n["id"] == ns.id for n in admin.namespaces())


def test_admin_evict_drops_a_prefix_a_namespace_or_everything(kvtierd: KvtierdProcess) -> None:
    admin = kvtierd.admin()
    with connect(kvtierd) as c:
        ns, other = open_ns(c), open_ns(c, model_id="test/other")
        a = prompt(30, 3 * CHUNK)
        b = np.concatenate([a[:2 * CHUNK], prompt(31, CHUNK)])  # shares chunks 0 and 1 with a
        c.store(ns, a, payloads(ns, 3, 30))
        c.store(ns, b, payloads(ns, 3, 31))
        c.store(other, a, payloads(other, 3, 32))
        # Prompts beginning with a's first 2 chunks (plus a partial tail): chunk 1 and after.
        got = admin.evict(namespace=ns.id, tokens=a[:2 * CHUNK + 5])
        assert got["dram"] == {"removed": 3, "kept": 0}
        assert c.lookup(ns, a).num_chunks == 1 and c.lookup(ns, b).num_chunks == 1
        # A lease keeps its chunks (and reports them); the other namespace is untouched.
        with c.acquire(ns, a) as lease:
            assert lease.num_chunks == 1
            assert admin.evict(namespace=ns.id)["dram"] == {"removed": 0, "kept": 1}
        deadline = time.monotonic() + 5  # the SDK hands releases to a background thread
        while admin.stats()["active_leases"] and time.monotonic() < deadline:
            time.sleep(0.01)
        assert admin.evict(namespace=ns.id)["dram"] == {"removed": 1, "kept": 0}
        assert c.lookup(ns, a).num_chunks == 0
        assert c.lookup(other, a).num_chunks == 3
        assert admin.evict(all=True)["dram"] == {"removed": 3, "kept": 0}
        assert c.lookup(other, a).num_chunks == 0
        before = admin.stats()
        bad: list[dict[str, object]] = [
            {}, {"all": True, "namespace": ns.id}, {"all": True, "tokens": a},
            {"namespace": ns.id, "tokens": []}, {"namespace": ns.id, "tokens": np.zeros(0, np.int32)},
            {"namespace": "xyz"}, {"namespace": ns.id, "tokens": a[:CHUNK - 1]},
            {"namespace": ns.id, "tokens": [2**31]}]
        for kw in bad:
            with pytest.raises(kvtier.InvalidArgument) as refused:
                admin.evict(**kw)  # type: ignore[arg-type]
            # named as this API names them (kvtierd's own words said namespace_id)
            assert "namespace_id" not in str(refused.value), kw
        with pytest.raises(kvtier.NotFound):
            admin.evict(namespace="0" * 32, tokens=a)
        after = admin.stats()
        assert [t["chunks"] for t in after["tiers"]] == [t["chunks"] for t in before["tiers"]]


def test_admin_client_raises_when_the_daemon_is_gone(kvtierd: KvtierdProcess) -> None:
    admin = kvtierd.admin()
    kvtierd.kill9()
    with pytest.raises((kvtier.Unavailable, kvtier.DeadlineExceeded)):
        admin.stats()


def hash_tokens(hashes: list[bytes], chunk_tokens: int) -> np.ndarray:
    """Engine-keyed chunks: each 32-byte page hash as the first 8 int32 ids, zeros after."""
    out = np.zeros((len(hashes), chunk_tokens), dtype=np.int32)
    for i, h in enumerate(hashes):
        out[i, :8] = np.frombuffer(h, dtype="<i4")
    return out.reshape(-1)


def test_engine_keyed_namespace_names_chunks_by_the_engines_hash(
        kvtierd: KvtierdProcess) -> None:
    import hashlib
    with connect(kvtierd) as c:
        ns = open_ns(c, model_id="test/engine", engine_keyed=True)
        assert ns.engine_keyed
        hashes = [hashlib.sha256(f"page {i}".encode()).digest() for i in range(3)]
        tokens = hash_tokens(hashes, CHUNK)
        # Unchained: each page is keyed by the namespace and its own hash only.
        keys = kvtier.Client.chunk_keys(ns, tokens)
        assert keys[1:] == kvtier.Client.chunk_keys(ns, hash_tokens(hashes[1:], CHUNK))
        data = payloads(ns, 3, 20)
        assert c.store(ns, tokens, data).stored_chunks == 3
        out = np.zeros_like(data)
        assert c.load(ns, tokens, out).num_chunks == 3 and np.array_equal(out, data)
        # Pages are not chained by kvtier: a run starting at page 1 is found on its own.
        assert c.lookup(ns, hash_tokens(hashes[1:], CHUNK)).num_chunks == 2
        # Another hash with the same first 16 bytes is another page: a miss, then a page of
        # its own that leaves the real one alone.
        forged = hash_tokens([hashes[0][:16] + bytes(16)], CHUNK)
        assert c.lookup(ns, forged).num_chunks == 0
        assert c.store(ns, forged, payloads(ns, 1, 21)).stored_chunks == 1
        assert c.load(ns, tokens, out).num_chunks == 3 and np.array_equal(out, data)
        # The token-keyed namespace of the same model is another namespace.
        plain = open_ns(c, model_id="test/engine")
        assert plain.id != ns.id and c.lookup(plain, tokens).num_chunks == 0
        with pytest.raises(kvtier.InvalidArgument, match="below 8"):
            open_ns(c, model_id="test/engine", engine_keyed=True, chunk_tokens=4)
