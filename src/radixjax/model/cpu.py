"""The host CPU, where the fastest form of a product differs between CPUs measured
(benchmarks/README.md, "Another CPU: an Intel Xeon with AMX", fifteenth session).

An AMD EPYC with AVX2 (the sessions before): XLA's CPU dots lose to vector products that
read the stacked layer weights in place, up to 8 rows (model/dense_weights.py), and its
int8 dot loses to a f32 vector product of the int8 values at one row (model/quant.py).
An Intel Xeon with AMX tiles: XLA's GEMMs (YNNPACK; int8 on AMX) win from two rows in f32
(SmolLM2 f32 decode B = 8 180 -> 95 ms) and from one row in int8, padded (w8a8 B = 1
30 -> 25 ms). An AMD EPYC with AVX-512 VNNI and BF16 but no AMX (eighteenth to twentieth
sessions): XLA's bf16 GEMM (f32 sums) outruns its int8 one from ~128 rows, so a long
prefill's int8 products run on the int8 values as bf16 (model/quant.py). Which CPU it
is: the flags `amx_int8` and `avx512_bf16`."""

from __future__ import annotations

from functools import cache


@cache
def _flags() -> frozenset[str]:
    """This host's CPU flags (Linux: /proc/cpuinfo), empty where unreadable."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def has_amx() -> bool:
    """Whether this host's CPU has AMX int8 tiles."""
    return "amx_int8" in _flags()


def has_avx512_bf16() -> bool:
    """Whether this host's CPU has AVX-512 BF16 (bf16 pair products into f32 sums)."""
    return "avx512_bf16" in _flags()
