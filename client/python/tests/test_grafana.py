"""docs/grafana/kvtier.json against a real kvtierd: every series a panel's query names is
one the daemon exports at /metrics, and every label it groups by is one the series carry
(or one Prometheus adds at scrape time)."""

from __future__ import annotations

import json
import re
import urllib.request
from pathlib import Path
from typing import Any, Iterator

from prometheus_client.parser import text_string_to_metric_families

import kvtier
from kvtierd_process import KvtierdProcess
from test_metrics import free_port, open_namespace, prompt

DASHBOARD = Path(__file__).resolve().parents[3] / "docs" / "grafana" / "kvtier.json"
SCRAPE_LABELS = {"instance", "job"}  # added by Prometheus, not by the daemon


def panels(node: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for p in node.get("panels", []):
        yield p
        yield from panels(p)  # a collapsed row holds its panels


def exported(tmp_path: Path) -> tuple[set[str], set[str]]:
    """Sample names and label names of a real scrape, with every tier on and one lookup
    made (the series labelled by model have samples only once a model was seen)."""
    port = free_port()
    nvme = tmp_path / "nvme"
    nvme.mkdir()
    args = ["--metrics-address", f"127.0.0.1:{port}", "--nvme-path", str(nvme),
            "--nvme-bytes", "64MiB"]
    with KvtierdProcess(extra_args=args) as daemon:
        with kvtier.Client.connect(socket=daemon.socket, deadline_ms=2000) as c:
            c.lookup(open_namespace(c), prompt(0))
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            text = r.read().decode()
    names: set[str] = set()
    labels: set[str] = set()
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            names.add(s.name)
            labels.update(s.labels)
    return names, labels


def test_every_dashboard_query_names_a_series_the_daemon_exports(tmp_path: Path) -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    names, labels = exported(tmp_path)
    assert "kvtier_tier_hits_total" in names and "tier" in labels  # the scrape is real
    queries: list[tuple[str, str]] = []
    ids: set[int] = set()
    for p in panels(dashboard):
        assert p["id"] not in ids, f"panel id {p['id']} used twice"
        ids.add(p["id"])
        assert {"x", "y", "w", "h"} <= set(p["gridPos"]), p["title"]
        if p["type"] == "row":
            continue
        assert p["datasource"]["uid"] == "${datasource}", p["title"]
        assert p["targets"], f"panel '{p['title']}' has no query"
        queries += [(p["title"], t["expr"]) for t in p["targets"]]
    for title, expr in queries:
        assert expr.count("(") == expr.count(")"), (title, expr)
        used = set(re.findall(r"\bkvtier_[a-z_]+\b", expr))
        assert used, f"panel '{title}': a query naming no kvtier series: {expr}"
        unknown = used - names
        assert not unknown, f"panel '{title}' names series kvtierd does not export: {unknown}"
        for group in re.findall(r"\bby \(([^)]*)\)", expr):
            for label in (g.strip() for g in group.split(",")):
                assert label in labels | SCRAPE_LABELS, f"panel '{title}' groups by '{label}'"
    # The panels: hit rate, tier fill, GB/s, errors.
    titles = {p["title"] for p in panels(dashboard)}
    assert {"Token hit rate", "Tier fill", "Read throughput", "I/O errors and corrupt reads",
            "Lookup latency"} <= titles
