from __future__ import annotations

import sys
from argparse import Namespace

from tests.bench_serving.conftest import BENCHMARKS

sys.path.insert(0, str(BENCHMARKS / "peers"))
import compare  # noqa: E402


def cell(tok_s: float, ttft: float, hit: float | None, reported: float | None) -> dict:
    s = {"mean": ttft, "median": ttft, "p99": ttft}
    return {"output_throughput": tok_s, "request_throughput": tok_s / 10, "ttft_ms": s,
            "tpot_ms": s, "itl_ms": s, "e2e_ms": s, "cache_hit_rate": hit,
            "reported_hit_rate": reported}


def test_table_has_ratios_ours_over_each_peer():
    args = Namespace(servers=["ours", "llama.cpp", "hf"], workloads=["multi-turn"],
                     concurrency=[16], rounds=1)
    results = {"ours": {"multi-turn/c16": [cell(200.0, 50.0, 0.6, 0.6)]},
               "llama.cpp": {"multi-turn/c16": [cell(100.0, 100.0, None, 0.5)]},
               "hf": {"multi-turn/c16": [cell(20.0, 500.0, None, None)]}}
    lines = compare.table(results, args).splitlines()
    assert lines[0] == ("| workload | c | metric | ours | llama.cpp | hf | ours/llama.cpp "
                        "| ours/hf |")
    rows = {line.split(" | ")[2]: line for line in lines[2:]}
    assert rows["output tok/s"].endswith("| 200.0 | 100.0 | 20.0 | 2.00 | 10.00 |")
    assert rows["TTFT median ms"].endswith("| 50.0 | 100.0 | 500.0 | 0.50 | 0.10 |")
    assert rows["cache hit rate"].endswith("| 0.60 | 0.50 | - |  |  |")


def test_table_has_a_ratio_column_per_variant_of_ours_and_peer():
    args = Namespace(servers=["ours", "ours-w8a8", "llama.cpp"], workloads=["multi-turn"],
                     concurrency=[8], rounds=1)
    results = {"ours": {"multi-turn/c8": [cell(200.0, 50.0, 0.6, 0.6)]},
               "ours-w8a8": {"multi-turn/c8": [cell(300.0, 40.0, 0.6, 0.6)]},
               "llama.cpp": {"multi-turn/c8": [cell(100.0, 100.0, None, 0.5)]}}
    lines = compare.table(results, args).splitlines()
    assert lines[0] == ("| workload | c | metric | ours | ours-w8a8 | llama.cpp "
                        "| ours/llama.cpp | ours-w8a8/llama.cpp |")
    rows = {line.split(" | ")[2]: line for line in lines[2:]}
    assert rows["output tok/s"].endswith("| 200.0 | 300.0 | 100.0 | 2.00 | 3.00 |")
    assert rows["ITL p99 ms"].endswith("| 50.0 | 40.0 | 100.0 | 0.50 | 0.40 |")


def test_rounds_give_medians_and_each_rounds_ratio():
    """--rounds: every metric is its median over the rounds, and one more row lists each
    round's output tok/s and ratio (the VM's drift shows there)."""
    args = Namespace(servers=["ours", "llama.cpp"], workloads=["multi-turn"],
                     concurrency=[8], rounds=3)
    results = {"ours": {"multi-turn/c8": [cell(v, 50.0, 0.6, 0.6) for v in (100, 200, 150)]},
               "llama.cpp": {"multi-turn/c8": [cell(v, t, None, h) for v, t, h in
                                               ((50, 90, 0.5), (100, 100, 0.4), (40, 200, 0.7))]}}
    lines = compare.table(results, args).splitlines()
    rows = {line.split(" | ")[2]: line for line in lines[2:]}
    assert rows["output tok/s"].endswith("| 150.0 | 50.0 | 3.00 |")
    assert rows["TTFT median ms"].endswith("| 50.0 | 100.0 | 0.50 |")
    assert rows["cache hit rate"].endswith("| 0.60 | 0.50 |  |")
    assert rows["output tok/s by round"].endswith(
        "| 100.0 / 200.0 / 150.0 | 50.0 / 100.0 / 40.0 | 2.00 / 2.00 / 3.75 |")
