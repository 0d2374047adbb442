"""The /dashboard page in a real browser: headless Chromium (Debian's chromium and
chromium-driver, installed by scripts/setup.sh test) through selenium, against the shared
SmolLM2 server while chat traffic with a shared system prompt runs. It checks what a
person would see: the shared prompt's node in the tree, in use by the running requests
the page lists, and, once the traffic ends, the pool numbers /get_server_info gives."""

from __future__ import annotations

import os
import shutil
import threading
import time
from pathlib import Path

import httpx
from selenium import webdriver
from selenium.webdriver.chrome.options import Options
from selenium.webdriver.chrome.service import Service

from tests.server.conftest import MODEL, wait_idle

SYSTEM = ("You are a patient assistant for a public library. Answer questions about "
          "opening hours, borrowing rules, reading rooms and events in two sentences. ") * 4
DOCS = Path(__file__).parents[2] / "docs" / "dashboard.png"


def _browser() -> webdriver.Chrome:
    options = Options()
    options.binary_location = shutil.which("chromium") or "/usr/bin/chromium"
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1280,1500"):
        options.add_argument(arg)
    driver = shutil.which("chromedriver") or "/usr/bin/chromedriver"
    return webdriver.Chrome(service=Service(driver), options=options)


def _traffic(url: str, stop: threading.Event, errors: list) -> None:
    """Chats that share the system prompt, one after another, until told to stop."""
    i = 0
    with httpx.Client(timeout=120) as client:
        while not stop.is_set():
            i += 1
            r = client.post(url + "/v1/chat/completions", json={
                "model": MODEL, "max_tokens": 48, "temperature": 1.0,
                "messages": [{"role": "system", "content": SYSTEM},
                             {"role": "user", "content": f"Question {i}: when can I come?"}]})
            if r.status_code != 200:
                errors.append(r.text)


# What the page shows, read in one go (it redraws every second: elements found one call
# earlier may be gone)
PAGE_STATE = """
const attr = (e, a) => e.getAttribute(a) || "";
return {
  running: [...document.querySelectorAll("table.running tr[data-rid]")].map(
    r => attr(r, "data-rid")),
  nodes: [...document.querySelectorAll("g.node")].map(g => ({
    text: attr(g, "data-text"), state: attr(g, "data-state"),
    requests: attr(g, "data-requests").split(" ").filter(x => x),
    tokens: Number(attr(g, "data-tokens"))})),
  cards: Object.fromEntries([...document.querySelectorAll(".card[data-stat]")].map(
    c => [attr(c, "data-stat"), c.querySelector("b").textContent])),
  error: document.getElementById("error").textContent,
};
"""


def _page(driver: webdriver.Chrome) -> dict:
    return driver.execute_script(PAGE_STATE)


def test_the_page_shows_the_shared_prefix_the_requests_and_the_pool(server, tmp_path) -> None:
    stop, errors = threading.Event(), []
    clients = [threading.Thread(target=_traffic, args=(server, stop, errors)) for _ in range(4)]
    for c in clients:
        c.start()
    browser = _browser()
    try:
        browser.get(server + "/dashboard")
        deadline, seen = time.monotonic() + 120, None
        while seen is None and time.monotonic() < deadline:
            page = _page(browser)
            running = set(page["running"])
            for node in page["nodes"]:
                users = set(node["requests"])
                # the shared system prompt's node, in use by requests the table lists
                if "patient assistant for a public library" in node["text"] \
                        and len(users) >= 2 and users <= running and node["state"] == "in-use":
                    seen = (running, users, node["tokens"])
                    break
            if seen is None:
                time.sleep(0.25)
        assert seen is not None, browser.page_source[-3000:]
        if os.environ.get("RADIXJAX_SAVE_DASHBOARD"):  # docs/dashboard.png, by hand: the
            time.sleep(20)  # charts with some history, the answers cached in the tree
        browser.save_screenshot(str(tmp_path / "dashboard.png"))
        running, users, tokens = seen
        assert tokens > 60  # the system prompt's tokens (and the template's around it)
        stop.set()
        for c in clients:
            c.join()
        assert not errors, errors[:2]
        stats = wait_idle(server)
        deadline = time.monotonic() + 30  # the page's next refresh shows the idle engine
        while time.monotonic() < deadline:
            cards = _page(browser)["cards"]
            if cards.get("running") == "0" and cards.get("kv_usage") == \
                    f"{100 * stats['kv_usage']:.1f} %":
                break
            time.sleep(0.25)
        info = httpx.get(server + "/get_server_info", timeout=10).json()["stats"]
        assert cards["running"] == "0" and cards["waiting"] == "0"
        assert cards["kv_usage"] == f"{100 * info['kv_usage']:.1f} %"
        assert cards["usable"] == str(info["kv_usable"])
        assert cards["held"] == str(info["kv_held"]) == "0"
        assert cards["late_compiles"] == str(info["num_late_compiles"]) == "0"
        assert cards["cache_hit_rate"] == f"{100 * info['cache_hit_rate']:.1f} %"
        assert not _page(browser)["error"]
        if os.environ.get("RADIXJAX_SAVE_DASHBOARD"):  # docs/dashboard.png, by hand
            shutil.copy(tmp_path / "dashboard.png", DOCS)
    finally:
        stop.set()
        browser.quit()
        for c in clients:
            c.join()
