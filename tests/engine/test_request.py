"""A request's slot list and token reads: O(new) per step, views never change."""

import numpy as np

from radixjax.engine.request import Req
from radixjax.sampling.params import SamplingParams


def test_appended_slots_leave_earlier_views_as_they_were() -> None:
    r = Req("r", [1, 2, 3], SamplingParams(), seed=0)
    r.slots = np.arange(10, 13)
    views = [r.slots]
    for k in range(100):  # past several buffer doublings
        r.append_slots(np.array([100 + k]))
        views.append(r.slots)
    assert r.slots.tolist() == [10, 11, 12] + list(range(100, 200))
    for i, v in enumerate(views):
        assert v.tolist() == r.slots[: 3 + i].tolist()
    kept = r.slots
    r.slots = np.arange(5)  # replaced: a fresh buffer, the old view untouched
    assert kept.tolist() == [10, 11, 12] + list(range(100, 200))
    assert r.slots.tolist() == list(range(5)) and r.slots.dtype == np.int64


def test_ids_reads_prompt_and_output_by_position() -> None:
    r = Req("r", [1, 2, 3, 4], SamplingParams(), seed=0, output_ids=[5, 6, 7])
    every = r.all_ids
    for start in range(8):
        for end in range(start, 8):
            assert r.ids(start, end) == every[start:end]
