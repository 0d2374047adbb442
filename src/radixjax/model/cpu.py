"""The host CPU, where the fastest form of a product differs between CPUs measured
(benchmarks/README.md, "Another CPU: an Intel Xeon with AMX", fifteenth session).

An AMD EPYC with AVX2 (the sessions before): XLA's CPU dots lose to vector products that
read the stacked layer weights in place, up to 8 rows (model/dense_weights.py), and its
int8 dot loses to a f32 vector product of the int8 values at one row (model/quant.py).
An Intel Xeon with AMX tiles: XLA's GEMMs (YNNPACK; int8 on AMX) win from two rows in f32
(SmolLM2 f32 decode B = 8 180 -> 95 ms) and from one row in int8, padded (w8a8 B = 1
30 -> 25 ms). Which CPU it is: the AMX flag."""

from __future__ import annotations

from functools import cache


@cache
def has_amx() -> bool:
    """Whether this host's CPU has AMX int8 tiles (Linux: /proc/cpuinfo's flags)."""
    try:
        with open("/proc/cpuinfo") as f:
            return any(line.startswith("flags") and "amx_int8" in line.split() for line in f)
    except OSError:
        return False
