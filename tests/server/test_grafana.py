"""docs/grafana/radixjax.json (the Grafana dashboard for /metrics, as SGLang ships one):
every series a panel queries is one the server exports, under the labels it uses."""

from __future__ import annotations

import json
import re
from pathlib import Path

import httpx

from tests.server.conftest import MODEL

DASHBOARD = Path(__file__).parents[2] / "docs" / "grafana" / "radixjax.json"
# the DP replicas' series exist only on a --dp server (tests/server/test_router.py's)
DP_ONLY = {"radixjax_dp_kv_cache_usage", "radixjax_dp_num_running_reqs",
           "radixjax_dp_requests_routed"}


def test_every_queried_series_is_exported(server) -> None:
    dash = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p["targets"]]
    assert len(exprs) >= 15
    queried = {name for e in exprs for name in re.findall(r"\bradixjax_\w+", e)}
    r = httpx.post(server + "/v1/completions", timeout=60,  # (a labelled series shows up
                   json={"model": MODEL, "prompt": "Hi", "max_tokens": 2})  # once used)
    assert r.status_code == 200, r.text
    text = httpx.get(server + "/metrics", timeout=10).text
    exported = set(re.findall(r"^(radixjax_\w+)", text, re.M))
    assert queried - DP_ONLY <= exported, queried - DP_ONLY - exported
    assert DP_ONLY <= queried
    for e in exprs:  # labels the panels group or name by are the metrics' own
        for label in re.findall(r"by \((\w+)\)", e) + re.findall(r"\{\{(\w+)\}\}", e):
            assert label in {"le", "reason", "dp_rank"}, e
