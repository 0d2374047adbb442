"""Hypothesis profiles for the cache tests, registered here and picked per test module.

`RADIXJAX_CACHE_PROFILE=thorough` runs the property tests ~20x longer than the default
`fast` profile, which keeps tests/cache under a minute on 2 cores; `noshrink` fails fast
without minimising the example (for checking that injected bugs are caught).
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, Phase, settings

settings.register_profile(
    "radixjax-cache-fast",
    max_examples=300,
    stateful_step_count=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile(
    "radixjax-cache-thorough",
    max_examples=3000,
    stateful_step_count=100,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)

# For checking that the tests catch injected bugs: fail fast, skip shrinking.
settings.register_profile(
    "radixjax-cache-noshrink",
    parent=settings.get_profile("radixjax-cache-fast"),
    phases=[Phase.explicit, Phase.reuse, Phase.generate],
)


def cache_profile() -> settings:
    return settings.get_profile(
        "radixjax-cache-" + os.environ.get("RADIXJAX_CACHE_PROFILE", "fast")
    )
