"""A request's slot list and token reads (O(new) per step, views never change), and a
disaggregated prompt landing in the scheduler's KV."""

import types

import numpy as np
import pytest

from radixjax.cache.errors import OutOfKVSlots
from radixjax.engine.config import EngineConfig
from radixjax.engine.request import Req
from radixjax.engine.scheduler import Scheduler
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


def test_land_prompt_caches_the_prompt_or_holds_nothing() -> None:
    """A decode server's landing (engine/handoff.py): the prompt's KV written into fresh
    slots and cached in the radix tree; a write that fails, or no room, holds nothing."""
    cfg = EngineConfig(num_slots=64, max_running=2, max_context=32, max_prefill_tokens=16,
                       chunk_size=16)
    s = Scheduler(types.SimpleNamespace(), cfg, eos_token_ids=(0,))
    free = s.kvm.allocator.num_free_slots

    def broken(slots: np.ndarray) -> None:
        raise RuntimeError("the transfer broke")

    with pytest.raises(RuntimeError, match="broke"):
        s.land_prompt(Req("a", list(range(3, 13)), SamplingParams(), seed=0), broken)
    held = s.kvm.allocator.alloc(free - 5)  # (taken behind the scheduler's back)
    with pytest.raises(OutOfKVSlots):
        s.land_prompt(Req("b", list(range(3, 13)), SamplingParams(), seed=0), broken)
    s.kvm.allocator.free(held)
    assert s.kvm.allocator.num_free_slots == free and s.cached_prefix_len(range(3, 13)) == 0
    s.check_integrity()
    written = []
    s.land_prompt(Req("c", list(range(3, 13)), SamplingParams(), seed=0), written.append)
    assert len(written[0]) == 10 and s.cached_prefix_len(list(range(3, 13))) == 10
    s.check_integrity()


def test_aborting_waiting_requests_takes_them_out_in_order() -> None:
    """Thousands of waiting requests aborted (a client leaving a batch): each finishes
    once with "abort", the rest keep their order, a retraction goes first."""
    cfg = EngineConfig(num_slots=64, max_running=2, max_context=32, max_prefill_tokens=16,
                       chunk_size=16)
    s = Scheduler(types.SimpleNamespace(), cfg, eos_token_ids=(0,))
    reqs = [Req(str(i), [3, 4, 5], SamplingParams(), seed=i) for i in range(5000)]
    ends: list[str] = []
    for r in reqs:
        r.on_chunk = lambda chunk, r=r: ends.append(r.rid) if chunk.finish_reason else None
        s.add_request(r)
    for r in reqs[::2]:
        s.abort(r)
    assert [r.rid for r in s.waiting] == [r.rid for r in reqs[1::2]]
    assert ends == [r.rid for r in reqs[::2]] and {r.finish_reason for r in reqs[::2]} == {
        "abort"}
    s.waiting.push_front(reqs[0])
    assert next(iter(s.waiting)) is reqs[0] and len(s.waiting) == 2501
