"""kvtierd's Prometheus /metrics against a real daemon: scraped under load, parsed with
prometheus_client's own text parser, and matched figure by figure with `kvtierctl stats
--json` once the load stops."""

from __future__ import annotations

import json
import socket
import subprocess
import threading
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
from prometheus_client.parser import text_string_to_metric_families

import kvtier
from kvtierd_process import KvtierdProcess, bin_dir

CHUNK = 16

# kvtierctl stats --json's tier fields, and the series each is exported as. hits and
# read_bytes are what was served: their counters hold the unserved ones too (a counter
# never goes down), so they are compared apart.
TIER_SERIES = {
    "capacity_bytes": "kvtier_tier_capacity_bytes", "used_bytes": "kvtier_tier_used_bytes",
    "capacity_chunks": "kvtier_tier_capacity_chunks", "chunks": "kvtier_tier_chunks",
    "misses": "kvtier_tier_misses",
    "unserved_hits": "kvtier_tier_unserved_hits_total",
    "unserved_read_bytes": "kvtier_tier_unserved_read_bytes_total",
    "evictions": "kvtier_tier_evictions_total",
    "write_bytes": "kvtier_tier_written_bytes_total",
    "pending_writes": "kvtier_tier_pending_writes",
    "corrupt_reads": "kvtier_tier_corrupt_reads_total",
    "io_errors": "kvtier_tier_io_errors_total",
    "skipped_writes": "kvtier_tier_skipped_writes_total",
    "lost_writes": "kvtier_tier_lost_writes_total",
    "throttled_writes": "kvtier_tier_throttled_writes_total",
    "pinned_chunks": "kvtier_tier_pinned_chunks",
    "uncommitted_bytes": "kvtier_tier_uncommitted_bytes", "degraded": "kvtier_tier_degraded",
}
DAEMON_SERIES = {
    "lookups": "kvtier_lookups_total", "ring_lookups": "kvtier_ring_lookups_total",
    "ring_calls": "kvtier_ring_calls_total", "lookup_tokens": "kvtier_lookup_tokens_total",
    "lookup_chunks": "kvtier_lookup_chunks_total",
    "unserved_hit_tokens": "kvtier_unserved_hit_tokens_total",
    "prefetched_chunks": "kvtier_prefetched_chunks_total",
    "session_limited": "kvtier_session_limited_total", "sessions": "kvtier_sessions",
    "active_leases": "kvtier_active_leases", "active_reservations": "kvtier_active_reservations",
    "active_prefetches": "kvtier_active_prefetches", "uptime_s": "kvtier_uptime_seconds",
}


def open_namespace(c: kvtier.Client) -> kvtier.Namespace:
    return c.open_namespace(model_id="test/metrics", num_layers=2, kv_dtype="float16",
                            num_kv_heads=2, head_dim=8, chunk_tokens=CHUNK)


def prompt(k: int) -> np.ndarray:
    """The k-th prompt of the load: 8 chunks of tokens."""
    return np.random.default_rng(k).integers(0, 128_000, size=8 * CHUNK, dtype=np.int32)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


HISTOGRAMS = ("lookup", "load", "store", "promotion", "nvme_read", "nvme_write")


def scrape(port: int) -> dict[tuple[str, str], float]:
    """(sample name, its tier or le label or "") -> value, through prometheus_client's
    parser. Series labelled by model or outcome are keyed "name|model|tier" or
    "name|outcome"."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        assert r.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        text = r.read().decode()
    out: dict[tuple[str, str], float] = {}
    for family in text_string_to_metric_families(text):
        assert family.documentation, family.name  # every family has its HELP
        assert family.type in ("counter", "gauge", "histogram"), family
        for s in family.samples:
            if "model" in s.labels:
                key = ("|".join([s.name, s.labels["model"], s.labels.get("tier", "")]), "")
            elif "outcome" in s.labels:
                key = (s.name + "|" + s.labels["outcome"], "")
            else:
                key = (s.name, s.labels.get("tier", s.labels.get("le", "")))
            assert key not in out, key
            out[key] = s.value
    return out


def ctl_stats(daemon: KvtierdProcess) -> dict[str, object]:
    r = subprocess.run([str(bin_dir() / "kvtierctl"), "--socket", daemon.socket, "--json",
                        "stats"], capture_output=True, text=True, timeout=30, check=True)
    stats: dict[str, object] = json.loads(r.stdout)
    return stats


def test_a_scrape_under_load_matches_kvtierctl_stats(tmp_path: Path) -> None:
    port = free_port()
    nvme = tmp_path / "nvme"
    nvme.mkdir()
    # DRAM of 2 MiB against 4 MiB stored: evictions, NVMe hits and writes all move.
    args = ["--metrics-address", f"127.0.0.1:{port}", "--nvme-path", str(nvme),
            "--nvme-bytes", "64MiB"]
    with KvtierdProcess(dram_bytes="2MiB", extra_args=args) as daemon:
        stop = threading.Event()
        errors: list[BaseException] = []

        def load() -> None:
            try:
                with kvtier.Client.connect(socket=daemon.socket, deadline_ms=2000) as c:
                    ns = open_namespace(c)
                    rng = np.random.default_rng(7)
                    i = 0
                    while not stop.is_set() or i < 300:
                        tokens = prompt(i % 150)
                        data = rng.integers(0, 256, size=8 * ns.payload_bytes, dtype=np.uint8)
                        c.store(ns, tokens, data)
                        out = np.empty_like(data)
                        c.load(ns, tokens, out)
                        i += 1
            except BaseException as e:  # reported by the test thread
                errors.append(e)

        worker = threading.Thread(target=load)
        worker.start()
        previous: dict[tuple[str, str], float] = {}
        try:
            for _ in range(20):  # scrapes while the client works: counters never go back
                now = scrape(port)
                for key, value in now.items():
                    if key[0].endswith("_total") and key in previous:
                        assert value >= previous[key], (key, previous[key], value)
                previous = now
        finally:
            stop.set()
            worker.join(timeout=120)
        assert not worker.is_alive()
        assert not errors, errors
        # The prompts stored first are on NVMe only by now: loading them promotes them,
        # every other one through a prefetch; and one prefetch of a prompt never stored.
        with kvtier.Client.connect(socket=daemon.socket, deadline_ms=5000) as c:
            ns = open_namespace(c)
            for k in range(150):
                ticket = c.prefetch(ns, prompt(k)) if k % 2 else None
                c.load(ns, prompt(k), np.empty(8 * ns.payload_bytes, dtype=np.uint8), ticket)
            c.prefetch(ns, prompt(1_000))

        stats = ctl_stats(daemon)
        scraped = scrape(port)
        tiers = stats["tiers"]
        assert isinstance(tiers, list)
        assert {t["name"] for t in tiers} == {"dram", "nvme"}
        for tier in tiers:
            name = tier["name"]
            for field, series in TIER_SERIES.items():
                assert scraped[(series, name)] == float(tier[field]), (series, tier)
            assert (scraped[("kvtier_tier_hits_total", name)]
                    - scraped[("kvtier_tier_unserved_hits_total", name)]) == tier["hits"], tier
            assert (scraped[("kvtier_tier_read_bytes_total", name)]
                    - scraped[("kvtier_tier_unserved_read_bytes_total", name)]
                    == tier["read_bytes"]), tier
        assert (scraped[("kvtier_hit_tokens_total", "")]
                - scraped[("kvtier_unserved_hit_tokens_total", "")]) == stats["hit_tokens"]
        # Tokens by model: the load's one model holds every token.
        models = stats["models"]
        assert isinstance(models, list) and [m["model_id"] for m in models] == ["test/metrics"]
        model = models[0]
        assert model["lookup_tokens"] == stats["lookup_tokens"]
        assert scraped[("kvtier_model_lookup_tokens_total|test/metrics|", "")] == \
            model["lookup_tokens"]
        for tier in ("dram", "nvme"):
            served = scraped[(f"kvtier_model_hit_tokens_total|test/metrics|{tier}", "")] - \
                scraped[(f"kvtier_model_unserved_hit_tokens_total|test/metrics|{tier}", "")]
            assert served == model["hit_tokens"][tier], (tier, model)
        assert sum(model["hit_tokens"].values()) == stats["hit_tokens"]
        prefetches = stats["prefetches"]
        assert isinstance(prefetches, dict)
        for outcome, count in prefetches.items():
            assert scraped[(f"kvtier_prefetches_total|{outcome}", "")] == count, outcome
        assert prefetches["nothing_cached"] >= 1, prefetches
        sdk = kvtier.AdminClient.connect(socket=daemon.socket).stats()  # the binding's view
        assert sdk["prefetches"] == prefetches
        assert [(m["model_id"], m["lookup_tokens"], m["hit_tokens"]) for m in sdk["models"]] == \
            [(m["model_id"], m["lookup_tokens"], m["hit_tokens"]) for m in models]
        assert prefetches["used"] + prefetches["used_early"] > 0, prefetches
        for field, series in DAEMON_SERIES.items():
            value = stats[field]
            assert isinstance(value, int)
            if field == "uptime_s":  # a second may pass between the two reads
                assert abs(scraped[(series, "")] - value) <= 1
            else:
                assert scraped[(series, "")] == float(value), (series, stats)
        # The load moved every figure it should (so the comparison above is not of zeros).
        dram = next(t for t in tiers if t["name"] == "dram")
        assert dram["evictions"] > 0 and dram["hits"] > 0 and stats["hit_tokens"] > 0
        assert scraped[("kvtier_tier_written_bytes_total", "nvme")] > 0
        nvme = next(t for t in tiers if t["name"] == "nvme")
        assert nvme["hits"] > 0  # so promotions and NVMe reads happened

        # Latency histograms: buckets cumulative, +Inf equal to the count, every kind seen,
        # and one Lookup observed per Lookup counted.
        for h in HISTOGRAMS:
            name = f"kvtier_{h}_seconds"
            buckets = sorted((float(le), v) for (n, le), v in scraped.items()
                             if n == name + "_bucket")
            assert len(buckets) == 21 and buckets[-1][0] == float("inf"), (name, buckets)
            counts = [v for _, v in buckets]
            assert counts == sorted(counts), (name, counts)
            assert counts[-1] == scraped[(name + "_count", "")] > 0, name
            assert scraped[(name + "_sum", "")] > 0, name
        assert scraped[("kvtier_lookup_seconds_count", "")] == scraped[("kvtier_lookups_total", "")]

        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/other", timeout=5)
            raise AssertionError("a path other than /metrics was served")
        except urllib.error.HTTPError as e:
            assert e.code == 404


def test_idle_connections_do_not_hold_a_scrape_up() -> None:
    """A fresh-user trial found one connection that sends nothing held /metrics' only
    thread for its 5 s read timeout (3 of them: 15 s, past Prometheus' 10 s scrape
    timeout). Three idle connections now leave a scrape free to be answered."""
    port = free_port()
    with KvtierdProcess(extra_args=["--metrics-address", f"127.0.0.1:{port}"]):
        idle = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(3)]
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=4) as r:
                assert b"kvtier_lookups_total" in r.read()
        finally:
            for s in idle:
                s.close()
