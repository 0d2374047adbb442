"""How fast n-gram speculation could be on each workload of benchmarks/speculative.py, from
the model's own greedy answers: the plan's speed-up (engine/speculative.py's policy,
replayed) and a clairvoyant bound (each step drafts exactly what will be accepted).

    .venv/bin/python benchmarks/speculative_bound.py    # ~2 min

Greedy output is the same with and without drafts, so a request's drafts at each
position are known from its plain answer: the request's own n-grams (engine/drafts.py,
the radix tree left out: a first answer has nothing cached after its prompt). Costs, in
decode steps: a step of T tokens costs the engine's timed table (ModelRunner.time_buckets,
as at start-up) plus VERIFY_OVERHEAD when it verifies drafts; a plain step 1 (overlapped).
The replay waits a step after a step with no proposal, as the scheduler does (the next
step was already launched). Clairvoyant: the cheapest sequence of steps over the answer
when each step may verify any bucket's worth of the proposal, knowing what is accepted.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from speculative import MAX_TOKENS, render, workloads  # noqa: E402

from radixjax import Engine, SamplingParams  # noqa: E402
from radixjax.engine.drafts import NgramIndex  # noqa: E402
from radixjax.engine.speculative import VERIFY_OVERHEAD, DraftState, StepCosts, plan  # noqa: E402
from radixjax.loaders import default_model_path  # noqa: E402

MAX_DRAFTS = 15  # --speculative-num-draft-tokens' default


def proposals(prompt: list[int], answer: list[int]) -> list[list[int]]:
    """The drafts the request's n-grams propose before each token of its answer."""
    index, out = NgramIndex(prompt), []
    for token in answer:
        out.append(index.propose(MAX_DRAFTS))
        index.extend([token])
    return out


def accepted(drafts: list[int], answer: list[int], i: int) -> int:
    a = 0
    while a < len(drafts) and i + a < len(answer) and drafts[a] == answer[i + a]:
        a += 1
    return a


def verify_cost(costs: StepCosts, k: int) -> float:
    return costs.of(k + 1) + VERIFY_OVERHEAD


def replayed(answer: list[int], props: list[list[int]], costs: StepCosts) -> float:
    """The plan's cost of the answer, in decode steps."""
    state, cost, i, launched = DraftState(NgramIndex(())), 0.0, 0, True
    while i < len(answer):
        drafts = props[i][:len(answer) - i]
        k = 0
        if drafts and not launched:
            k = plan([state.alpha], [len(drafts)], costs, MAX_DRAFTS + 1)[0]
        if k:
            a = accepted(drafts[:k], answer, i)
            state.observe(k, a)
            cost += verify_cost(costs, k)
        else:
            state.idle()
            a, cost = 0, cost + 1.0
        launched = not drafts
        i += a + 1
    return cost


def clairvoyant(answer: list[int], props: list[list[int]], costs: StepCosts) -> float:
    """The least cost of the answer in decode steps, knowing each draft's fate."""
    n = len(answer)
    best = [0.0] * (n + 1)
    for i in range(n - 1, -1, -1):
        best[i] = 1.0 + best[i + 1]
        for t in costs.by_tokens:
            if 1 < t <= MAX_DRAFTS + 1 and props[i]:
                a = accepted(props[i][:t - 1], answer, i)
                best[i] = min(best[i], verify_cost(costs, t - 1) + best[min(n, i + a + 1)])
    return best[0]


def main() -> None:
    engine = Engine(default_model_path())
    costs = StepCosts.relative(engine.runner.time_buckets(engine.config.max_running))
    sp = SamplingParams(max_new_tokens=MAX_TOKENS, temperature=0.0)
    rows = []
    for name, convs in workloads(4).items():
        if name == "regenerated":
            continue  # its drafts come from the radix tree (the answer cached before)
        tokens = plan_cost = bound_cost = 0.0
        for text in render(engine.tokenizer, convs):
            prompt = engine.tokenizer.encode(text)
            answer = engine.generate(prompt, sp).token_ids
            props = proposals(prompt, answer)
            tokens += len(answer)
            plan_cost += replayed(answer, props, costs)
            bound_cost += clairvoyant(answer, props, costs)
        rows.append((name, tokens / plan_cost, tokens / bound_cost))
    engine.shutdown()
    print("step costs (decode steps):", {t: round(c, 2) for t, c in costs.by_tokens.items()},
          f"+ {VERIFY_OVERHEAD} per verify step")
    print("| workload | the plan, replayed | clairvoyant bound |")
    print("|---|---|---|")
    for name, ours, bound in rows:
        print(f"| {name} | {ours:.2f}x | {bound:.2f}x |")


if __name__ == "__main__":
    main()
