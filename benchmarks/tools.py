"""Tool calling: how many calls parse and validate, ours vs llama-server --jinja on the same
SmolLM2 GGUF, under tool_choice auto and required; and what our constraint costs.

    .venv/bin/python benchmarks/tools.py [--quick] [--peer] [--tools-template]

60 prompts (5 per tool) over 12 tool schemas (nested objects, enums, arrays, required
fields, bounded numbers, a pattern); each request offers its tool and two others, at
OpenAI's default temperature 1 with a seed per prompt, 4 at a time, max_tokens 128. Modes:
auto, required, and "agent turn": auto after a history of one earlier call of the same
tool (its result, an answer), the turn where small models do call. A call *parses* when
its arguments are JSON, and *validates* when its name is one of the offered tools and its
arguments satisfy that tool's schema (jsonschema); a last call cut off by max_tokens is
counted apart ("cut off"), not as a call. Templates: each server's own (the GGUF's ChatML,
no tools variable: ours falls back to its tools prompt), or with --tools-template both on
benchmarks/peers/chatml_tools.jinja (the same ChatML rendering the tools in the Hermes
form), so both see the same prompt. Table 2: our output tok/s under `required` (the
structural tag on) vs the same prompts unconstrained at the same output lengths
(/v1/completions on the same rendered prompt, ignore_eos), on the same warm server. Every
server is warmed with the whole workload once, untimed.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

import httpx
import jsonschema

sys.path.insert(0, str(Path(__file__).resolve().parent))
from peers.servers import RunningServer, server_specs  # noqa: E402

OBJ = "object"
TOOLS = {
    "get_weather": ({"type": OBJ, "properties": {
        "city": {"type": "string"}, "unit": {"enum": ["celsius", "fahrenheit"]}},
        "required": ["city", "unit"]}, "The current weather in a city",
        ["Weather in {c}?", "Is it raining in {c}?", "How cold is {c} today in fahrenheit?",
         "Give me the temperature in {c}.", "What should I wear in {c} today?"]),
    "search_web": ({"type": OBJ, "properties": {
        "query": {"type": "string"}, "max_results": {"type": "integer", "minimum": 1,
                                                     "maximum": 20}},
        "required": ["query"]}, "Search the web",
        ["Search the web for {c} museums.", "Find news about {c}.", "Look up the history "
         "of {c}, 5 results.", "Who is the mayor of {c}?", "Search for hotels in {c}."]),
    "book_flight": ({"type": OBJ, "properties": {
        "destination": {"type": "string"}, "passenger": {"type": OBJ, "properties": {
            "name": {"type": "string"}, "age": {"type": "integer", "minimum": 0,
                                                "maximum": 120}},
            "required": ["name", "age"]}, "seat": {"enum": ["window", "aisle", "middle"]}},
        "required": ["destination", "passenger"]}, "Book a flight for a passenger",
        ["Book a flight to {c} for Anna, 34, window seat.", "I need a flight to {c}; I am "
         "Tom, 52.", "Fly my son Leo (9) to {c}.", "Get me to {c}, name Ada, age 28, aisle.",
         "Book {c} for Mr. Smith, 70 years old."]),
    "create_event": ({"type": OBJ, "properties": {
        "title": {"type": "string"}, "attendees": {"type": "array", "items": {
            "type": "string"}, "minItems": 1, "maxItems": 5},
        "day": {"type": "integer", "minimum": 1, "maximum": 31}},
        "required": ["title", "attendees", "day"]}, "Create a calendar event",
        ["Set up a meeting in {c} with Bob and Sue on the 3rd.", "Lunch with Ann on day 12 "
         "in {c}.", "Schedule a {c} trip review with the team on the 20th.", "Invite Max "
         "to a party in {c} on the 1st.", "Calendar: {c} offsite, Jo and Kim, day 15."]),
    "set_thermostat": ({"type": OBJ, "properties": {
        "celsius": {"type": "number", "minimum": 10, "maximum": 30},
        "room": {"enum": ["living", "bedroom", "kitchen"]}},
        "required": ["celsius", "room"]}, "Set a room's thermostat",
        ["Set the bedroom to 21 degrees, like in {c}.", "Make the kitchen warmer, 24.",
         "Living room at 19.5 please.", "It is as hot as {c} here: cool the bedroom to 17.",
         "Heat the living room to 23."]),
    "send_email": ({"type": OBJ, "properties": {
        "to": {"type": "array", "items": {"type": "string"}, "minItems": 1},
        "subject": {"type": "string"}, "body": {"type": "string"},
        "priority": {"enum": ["low", "normal", "high"]}},
        "required": ["to", "subject", "body"]}, "Send an email",
        ["Email bob@x.com that I land in {c} at 6.", "Tell ann@y.org the {c} deal is "
         "done, high priority.", "Send my team the {c} agenda.", "Write to hr@z.com: I "
         "move to {c}.", "Email joe@x.com and sue@x.com about {c}."]),
    "convert_currency": ({"type": OBJ, "properties": {
        "amount": {"type": "number", "minimum": 0}, "source": {"enum": [
            "USD", "EUR", "GBP", "JPY"]}, "target": {"enum": ["USD", "EUR", "GBP", "JPY"]}},
        "required": ["amount", "source", "target"]}, "Convert an amount of money",
        ["How much is 100 USD in EUR for my {c} trip?", "Convert 2500 JPY to USD.",
         "50 GBP in yen?", "I have 12.5 EUR, how many dollars?", "Change 900 USD to GBP."]),
    "add_todo": ({"type": OBJ, "properties": {
        "title": {"type": "string"}, "due": {"type": OBJ, "properties": {
            "day": {"type": "integer", "minimum": 1, "maximum": 31},
            "month": {"type": "integer", "minimum": 1, "maximum": 12}},
            "required": ["day", "month"]}}, "required": ["title", "due"]},
        "Add a to-do item with a due date",
        ["Remind me to pack for {c} by March 3.", "To-do: renew passport before {c}, due "
         "5/6.", "Add 'call mom' due December 24.", "Buy {c} tickets by the 1st of July.",
         "Note: pay rent, due 30 September."]),
    "get_stock_price": ({"type": OBJ, "properties": {
        "ticker": {"type": "string", "pattern": "^[A-Z]{1,5}$"}}, "required": ["ticker"]},
        "The latest price of a stock",
        ["What is AAPL trading at?", "Price of MSFT?", "How is the {c} airline stock, "
         "ticker AF?", "Check NVDA.", "Quote for TSLA please."]),
    "translate": ({"type": OBJ, "properties": {
        "text": {"type": "string"}, "target": {"enum": ["fr", "de", "es", "it", "ja"]}},
        "required": ["text", "target"]}, "Translate a text",
        ["Translate 'good morning' to French for {c}.", "How do I say thank you in "
         "German?", "Spanish for 'where is the station'?", "Put 'I love {c}' in Italian.",
         "Translate 'hello' into Japanese."]),
    "order_pizza": ({"type": OBJ, "properties": {
        "size": {"enum": ["small", "medium", "large"]}, "toppings": {"type": "array",
                                                                       "items": {"enum": [
            "cheese", "ham", "mushroom", "olive", "pepper"]}, "maxItems": 4},
        "quantity": {"type": "integer", "minimum": 1, "maximum": 10}},
        "required": ["size", "quantity"]}, "Order pizza",
        ["Two large pizzas with ham.", "One small cheese pizza, {c} style.", "Order 3 "
         "medium pizzas with olives and peppers.", "A large mushroom pizza please.",
         "Get us 5 small pizzas."]),
    "get_directions": ({"type": OBJ, "properties": {
        "origin": {"type": "string"}, "destination": {"type": "string"},
        "mode": {"enum": ["walk", "bike", "car", "transit"]}},
        "required": ["origin", "destination", "mode"]}, "Directions between two places",
        ["How do I get from the station to {c} center by bike?", "Drive me from home to "
         "{c}.", "Walking route from the hotel to the {c} museum?", "Transit from the "
         "airport to {c}.", "Best way by car from {c} to the coast?"]),
}
CITIES = ["Paris", "Tokyo", "Lima", "Oslo", "Cairo"]
# one valid call per tool: the earlier turn of the "agent turn" mode's history
EXAMPLES = {
    "get_weather": {"city": "Rome", "unit": "celsius"},
    "search_web": {"query": "Rome museums", "max_results": 5},
    "book_flight": {"destination": "Rome", "passenger": {"name": "Eva", "age": 40}},
    "create_event": {"title": "Rome trip", "attendees": ["Eva"], "day": 4},
    "set_thermostat": {"celsius": 20, "room": "kitchen"},
    "send_email": {"to": ["eva@x.com"], "subject": "Rome", "body": "See you there."},
    "convert_currency": {"amount": 10, "source": "EUR", "target": "USD"},
    "add_todo": {"title": "Pack for Rome", "due": {"day": 2, "month": 5}},
    "get_stock_price": {"ticker": "IBM"},
    "translate": {"text": "good night", "target": "it"},
    "order_pizza": {"size": "medium", "quantity": 1},
    "get_directions": {"origin": "the hotel", "destination": "Rome", "mode": "walk"},
}
EARLIER = "Same thing as before, for Rome."
SCHEMAS = {name: spec[0] for name, spec in TOOLS.items()}


def tool(name: str) -> dict:
    schema, description, _ = TOOLS[name]
    return {"type": "function", "function": {"name": name, "description": description,
                                             "parameters": schema}}


def agent_turn(job: dict, name: str) -> dict:
    """The job as a later turn of an agent loop: an earlier request, the call it got, its
    result and answer, then this prompt."""
    call = {"id": "call_1", "type": "function", "function": {
        "name": name, "arguments": json.dumps(EXAMPLES[name])}}
    history = [{"role": "user", "content": EARLIER},
               {"role": "assistant", "content": None, "tool_calls": [call]},
               {"role": "tool", "tool_call_id": "call_1", "content": '{"ok": true}'},
               {"role": "assistant", "content": "Done."}]
    return {**job, "messages": history + job["messages"]}


def workload(per_tool: int) -> list[dict]:
    """(messages, the offered tools: its own and the next two) per prompt."""
    names = list(TOOLS)
    out = []
    for t, name in enumerate(names):
        for k, text in enumerate(TOOLS[name][2][:per_tool]):
            offered = [names[(t + j) % len(names)] for j in range(3)]
            out.append({"messages": [{"role": "user", "content": text.format(
                c=CITIES[k % len(CITIES)])}], "tools": [tool(n) for n in offered],
                "seed": 100 * t + k, "tool": name})
    return out


def judge(names: list[str], body: dict) -> dict:
    """One response -> {call, parsed, valid, cut, broken}: cut, a last call that
    max_tokens cut off (not counted as a call); broken, a <tool_call> that did not come
    back as a call."""
    if "error" in body or not body.get("choices"):
        return {"call": 0, "parsed": 0, "valid": 0, "cut": 0, "broken": 1}
    message = body["choices"][0]["message"]
    calls = message.get("tool_calls") or []
    cut = 0
    if calls and body["choices"][0]["finish_reason"] == "length":
        try:
            json.loads(calls[-1]["function"]["arguments"])
        except (ValueError, TypeError):
            calls, cut = calls[:-1], 1
    parsed = valid = 0
    for c in calls:
        try:
            args = json.loads(c["function"]["arguments"])
        except (ValueError, TypeError):
            continue
        parsed += 1
        name = c["function"]["name"]
        if name in names and not list(jsonschema.Draft202012Validator(
                SCHEMAS[name]).iter_errors(args)):
            valid += 1
    tried = "<tool_call>" in (message.get("content") or "")
    return {"call": len(calls), "parsed": parsed, "valid": valid, "cut": cut,
            "broken": int(tried)}


def run(url: str, model: str, jobs: list[dict], mode: str) -> tuple[list[dict], float]:
    """mode: a tool_choice, or "agent turn" (auto, after an earlier call in the history)."""
    choice = "auto" if mode == "agent turn" else mode

    def one(job: dict) -> dict:
        if mode == "agent turn":
            job = agent_turn(job, job["tool"])
        body = {"model": model, "messages": job["messages"], "tools": job["tools"],
                "tool_choice": choice, "seed": job["seed"], "max_tokens": 128}
        r = httpx.post(url + "/v1/chat/completions", json=body, timeout=600)
        out = r.json()
        names = [t["function"]["name"] for t in job["tools"]]
        return {**judge(names, out), "tokens": out.get("usage", {}).get(
            "completion_tokens", 0), "finish": (out.get("choices") or [{}])[0].get(
            "finish_reason", f"http {r.status_code}")}
    start = time.perf_counter()
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(one, jobs))
    return results, time.perf_counter() - start


def summary(name: str, choice: str, results: list[dict], wall: float) -> str:
    calls = sum(r["call"] for r in results)
    with_call = sum(1 for r in results if r["call"])
    valid = sum(r["valid"] for r in results)
    parsed = sum(r["parsed"] for r in results)
    broken = sum(r["broken"] for r in results)
    cut = sum(r["cut"] for r in results)
    share = f"{100 * valid / calls:.1f} %" if calls else "-"
    toks = sum(r["tokens"] for r in results)
    return (f"| {name} | {choice} | {len(results)} | {with_call} | {calls} | {parsed} | "
            f"{valid} | **{share}** | {cut} | {broken} | {toks / wall:.1f} |")


def constraint_cost(url: str, model: str, jobs: list[dict], tok, template: str) -> str:
    """Output tok/s of `required` vs the same rendered prompts unconstrained at the same
    lengths (ignore_eos), interleaved twice each on the same server."""
    from radixjax.api.tool_formats import FORMATS
    from radixjax.api.tool_prompt import chat_for_template
    from radixjax.api.tool_spec import parse_tools

    constrained, _ = run(url, model, jobs, "required")
    prompts = []
    for job in jobs:
        req = parse_tools({"tools": job["tools"], "tool_choice": "required"})
        msgs, extra = chat_for_template(job["messages"], req, FORMATS["hermes"], template)
        prompts.append(tok.apply_chat_template(msgs, add_generation_prompt=True,
                                               tokenize=False, chat_template=template,
                                               **extra))

    def plain() -> float:
        def one(i: int) -> int:
            n = max(constrained[i]["tokens"], 1)
            r = httpx.post(url + "/v1/completions", timeout=600, json={
                "model": model, "prompt": prompts[i], "max_tokens": n, "seed": jobs[i]["seed"],
                "ignore_eos": True})
            return r.json()["usage"]["completion_tokens"]
        start = time.perf_counter()
        with ThreadPoolExecutor(4) as pool:
            n = sum(pool.map(one, range(len(jobs))))
        return n / (time.perf_counter() - start)

    rates = {"required": [], "plain": []}
    for _ in range(2):
        results, wall = run(url, model, jobs, "required")
        rates["required"].append(sum(r["tokens"] for r in results) / wall)
        rates["plain"].append(plain())
    req, free = max(rates["required"]), max(rates["plain"])
    return (f"| {len(jobs)} | {free:.1f} | {req:.1f} | {req / free:.2f} |")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="2 prompts per tool")
    ap.add_argument("--peer", action="store_true", help="llama-server --jinja too")
    ap.add_argument("--out", default="/tmp/radixjax-tools")
    ap.add_argument("--tools-template", action="store_true",
                    help="both servers on benchmarks/peers/chatml_tools.jinja (SmolLM2's "
                         "ChatML plus tools in the Hermes form) instead of the GGUF's own")
    args = ap.parse_args()
    jobs = workload(2 if args.quick else 5)
    log_dir = Path(args.out)
    specs = server_specs(parallel=4)
    rows, cost = [], None
    template = str(Path(__file__).resolve().parent / "peers" / "chatml_tools.jinja")
    flag = {"ours": "--chat-template", "llama.cpp": "--chat-template-file"}
    for name in ["ours", *(["llama.cpp"] if args.peer else [])]:
        spec = specs[name]
        if args.tools_template:
            spec = replace(spec, command=(*spec.command, flag[name], template))
        server = RunningServer(spec, log_dir / f"{name}.log")
        try:
            model = httpx.get(spec.url + "/v1/models").json()["data"][0]["id"]
            run(spec.url, model, jobs, "auto")  # warm: the whole workload, untimed
            for choice in ("auto", "agent turn", "required"):
                results, wall = run(spec.url, model, jobs, choice)
                rows.append(summary(name, choice, results, wall))
                print(rows[-1], flush=True)
            if name == "ours":
                from radixjax.loaders import load_model
                tok = load_model(None).tokenizer
                cost = constraint_cost(spec.url, model, jobs, tok, Path(template).read_text()
                                       if args.tools_template else tok.chat_template)
        finally:
            server.stop()
    print("\n| server | tool_choice | requests | with a call | calls | parse | validate "
          "| valid share | cut off | broken | output tok/s |\n"
          "|---|---|---|---|---|---|---|---|---|---|---|")
    print("\n".join(rows))
    print("\n| requests | unconstrained tok/s | required tok/s | ratio |\n|---|---|---|---|")
    print(cost)


if __name__ == "__main__":
    main()
