"""The web playground in a real browser: headless Debian Chromium driven by Playwright (which never
downloads a browser of its own here), against a real `dllm-server serve` of the demo model with an
API key. One server and one browser for the whole story, to keep it cheap:

401 without the key; with it, the canvas starts fully masked and fills forward by forward to no
mask, replay shows every step, and the page's text is the JSON endpoint's text for the same seed;
two long requests in two more tabs fill the KV pool and the queue, so a third gets a 503; closing
one tab and pressing Stop in the other returns KV usage to 0; a killed server shows as a dropped
connection.

Screenshots go to $DLLM_PLAYGROUND_SCREENSHOTS when set (docs/img for the README), else tmp_path.
"""
from __future__ import annotations

import os
import shutil
import signal
from pathlib import Path

import httpx
import pytest

from dllm_server.api.app import build_app
from dllm_server.config import ServerConfig
from dllm_server.engine.async_engine import AsyncEngine

from .conftest import start_server
from .test_lifecycle import metric, wait_for

KEY = "playground-test-key"
# The closed network here: no background connections, no component updates, no QUIC.
CHROMIUM_FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"]
CHAT = {"prompt": "Good morrow, my lord. What news?", "max_tokens": 32, "threshold": 0.3, "seed": 1,
        "temperature": 0.7, "slo_ms": 60000}
# The README's pictures: a demo task (chat), at a threshold high enough that the demo model takes
# several forwards, each committing several cells (9 forwards for 18 positions on v3)
PICTURE = {"prompt": "Say this line back:\nNow is the winter of our discontent made glorious summer by this sun of York",
           "max_tokens": 32, "threshold": 0.99, "seed": 1, "temperature": 0.0}
# Three blocks of 256, one position per forward: it holds its KV pages (49 of them) for seconds.
# Token editing on the demo model: low thresholds make it rewrite cells it filled.
EDITING = {"prompt": "Write the numbers from one to ten.", "max_tokens": 64, "threshold": 0.1,
           "edit_threshold": 0.3, "seed": 1, "temperature": 0.7}
LONG = {"prompt": "ROMEO.", "max_tokens": 768, "block_length": 256, "steps": 768}


def _client(model: str, **config):
    from starlette.testclient import TestClient
    return TestClient(build_app(AsyncEngine(ServerConfig(model=model, **config)), "tiny"))


def test_page_and_info_are_served_open_with_a_strict_policy(tiny_llada):
    """No server process: the app around an engine that was never started."""
    with _client(tiny_llada, api_key="k") as c:
        r = c.get("/", follow_redirects=False)
        assert r.status_code == 307 and r.headers["location"] == "/playground"
        page = c.get("/playground")
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
        assert "default-src 'self'" in page.headers["content-security-policy"]
        for name in ("main.js", "api.js", "denoising.js", "view.js", "chart.js", "playground.css", "favicon.svg"):
            assert c.get(f"/playground/{name}").status_code == 200, name
        assert c.get("/playground/..%2Fplayground.py").status_code == 404
        assert c.get("/playground/nothing.js").status_code == 404
        info = c.get("/playground/info").json()
        assert info["auth_required"] is True and info["ready"] is False and info["model"] == "tiny"
        assert info["defaults"]["block_length"] == 32 and info["defaults"]["threshold"] == 0.9
        assert info["threshold_policy"] == "fixed" and info["default_slo_ms"] is None
        assert c.post("/v1/completions", json={"prompt": "a"}).status_code == 401    # the API stays closed


def test_info_reports_the_slo_policy(tiny_llada):
    with _client(tiny_llada, threshold_policy="slo", default_slo_ms=500.0) as c:
        info = c.get("/playground/info").json()
        assert info["threshold_policy"] == "slo" and info["default_slo_ms"] == 500.0 and not info["auth_required"]


def test_no_playground_flag(tiny_llada):
    with _client(tiny_llada, playground=False) as c:
        assert c.get("/", follow_redirects=False).status_code == 404
        assert c.get("/playground").status_code == 404 and c.get("/playground/info").status_code == 404


def _browser():
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip("browser test needs the playwright package: pip install -e '.[test]' "
                    "(it drives the system Chromium, no browser download)")
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe is None:
        pytest.skip("browser test needs Chromium: apt-get install chromium (Debian; .ci/run installs it)")
    return sync_playwright, exe


def fill(page, mode: str, **fields) -> None:
    page.check(f"input[name=mode][value={mode}]")
    for name in ("steps", "slo_ms", "edit_threshold", "max_post_edit_steps"):
        page.fill(f"#{name}", "")
    for name, value in fields.items():
        page.fill(f"#{name}", str(value))


def send(page, state: str) -> None:
    page.click("#send")
    page.wait_for_selector(f"body[data-run={state}]", timeout=60_000)


def numbers(page) -> dict:
    return page.evaluate("""() => Object.fromEntries([...document.querySelectorAll('#numbers dt')]
        .map(dt => [dt.textContent, dt.nextElementSibling.textContent]))""")


# Record the masked-cell count every time the page redraws the canvas (test-side, not page code).
WATCH_MASKED = """() => {
    const canvas = document.getElementById('canvas');
    window.maskedSeen = [];
    new MutationObserver(() => {
        if (canvas.querySelector('.cell')) window.maskedSeen.push(canvas.querySelectorAll('.cell.masked').length);
    }).observe(canvas, {subtree: true, childList: true, attributes: true, characterData: true});
}"""
# Masked cells at each replay position 0..N, stepping the slider as a user would.
REPLAY_MASKED = """() => {
    const slider = document.getElementById('slider'), out = [];
    for (let k = 0; k <= Number(slider.max); k++) {
        slider.value = String(k);
        slider.dispatchEvent(new Event('input'));
        out.push(document.querySelectorAll('#canvas .cell.masked').length);
    }
    return out;
}"""


def goto_step(page, k: int) -> None:
    page.evaluate("k => { const s = document.getElementById('slider'); s.value = String(k); "
                  "s.dispatchEvent(new Event('input')); }", k)


def test_playground_in_a_browser(tmp_path):
    sync_playwright, exe = _browser()
    shots = Path(os.environ.get("DLLM_PLAYGROUND_SCREENSHOTS") or tmp_path)
    # 64 pages of 16 tokens: one LONG canvas (49 pages) fits, a second waits, so the queue (1) is full.
    server = start_server(None, "--api-key", KEY, "--num-pages", "64", "--max-waiting-requests", "1",
                          tmp_path=tmp_path)
    auth = {"Authorization": f"Bearer {KEY}"}
    try:
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=exe, args=CHROMIUM_FLAGS)
            context = browser.new_context(viewport={"width": 1360, "height": 900})
            page = context.new_page()
            errors = []
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto(server.url + "/")                      # redirects to /playground
            page.wait_for_selector('#server-status:has-text("API key required")')

            # No key: the server's 401 becomes a message that says what to do.
            fill(page, "chat", **CHAT)
            send(page, "failed")
            assert "API key" in page.text_content("#message") and "401" in page.text_content("#message")

            # With the key: watch the canvas live, then replay it.
            page.fill("#api_key", KEY)
            page.evaluate(WATCH_MASKED)
            page.focus("#prompt")
            page.keyboard.press("Control+Enter")                     # keyboard only
            page.wait_for_selector("body[data-run=done]", timeout=60_000)
            seen = page.evaluate("window.maskedSeen")
            assert seen[0] == 32 and seen[-1] == 0, seen              # appeared all masked, ended with none
            assert all(a >= b for a, b in zip(seen, seen[1:])) and len(set(seen)) >= 3, seen
            replay = page.evaluate(REPLAY_MASKED)
            assert replay[0] == 32 and replay[-1] == 0, replay
            assert all(a > b for a, b in zip(replay, replay[1:])), replay     # every forward commits
            page.focus("#slider")
            page.keyboard.press("Home")
            assert page.locator("#canvas .cell.masked").count() == 32
            page.keyboard.press("End")
            assert page.locator("#canvas .cell.masked").count() == 0
            body = {"messages": [{"role": "user", "content": CHAT["prompt"]}], "block_length": 32,
                    **{k: v for k, v in CHAT.items() if k != "prompt"}}
            reply = httpx.post(server.url + "/v1/chat/completions", json=body, headers=auth, timeout=60).json()
            choice = reply["choices"][0]
            assert page.text_content("#answer") == choice["message"]["content"]
            shown = numbers(page)
            assert shown["forwards"] == str(choice["dllm"]["forwards"]) == str(len(replay) - 1)
            assert shown["steps per block"] == " · ".join(map(str, choice["dllm"]["steps_per_block"]))
            assert shown["commit rule"] == "threshold 0.3 (used)"
            assert shown["SLO"].startswith("met: ") and choice["dllm"]["slo_met"] is True

            # A demo task committing several cells a forward: the pictures for the README.
            fill(page, "chat", **PICTURE)
            send(page, "done")
            n = int(page.get_attribute("#slider", "max"))
            page.screenshot(path=str(shots / "playground_finished.png"), full_page=True)
            goto_step(page, n // 2)
            page.screenshot(path=str(shots / "playground_denoising.png"), full_page=True)
            goto_step(page, n)

            # Token editing: rewritten cells are marked, and the rewrites counted apart from the commits.
            fill(page, "completion", **EDITING)
            send(page, "done")
            goto_step(page, int(page.get_attribute("#slider", "max")))
            shown = numbers(page)
            rewrites = int(shown["positions committed"].split(" · ")[1].split()[0])
            assert 0 < page.locator("#canvas .cell.edited").count() <= rewrites, shown
            assert shown["commit rule"] == "threshold 0.1 + editing 0.3 (used)"

            # Two more tabs: one long request holds the KV pool, the next waits for room (queue full).
            # The second tab is sent only once the server runs the first: sent earlier (a loaded
            # machine admits late), it would find the one-request queue still full.
            tabs = []
            for running, waiting in ((1, 0), (1, 1)):
                tab = context.new_page()
                tab.goto(server.url + "/playground")
                tab.fill("#api_key", KEY)
                fill(tab, "completion", **LONG)
                tab.click("#send")
                tabs.append(tab)
                held = wait_for(lambda: metric(server, "dllm:num_requests_running") == running
                                and metric(server, "dllm:num_requests_waiting") == waiting
                                and metric(server, "dllm:kv_cache_usage_perc") > 0, timeout=30)
                state = tab.evaluate("document.body.dataset.run")
                assert held and state == "running", (len(tabs), state, tab.text_content("#message"),
                                                     [metric(server, f"dllm:num_requests_{k}") for k in ("running", "waiting")])
            fill(page, "chat", **CHAT)
            send(page, "failed")
            assert "503" in page.text_content("#message") and "queue is full" in page.text_content("#message")

            # Close the waiting tab, press Stop in the running one: each is a disconnect, which the
            # server answers by aborting the request and freeing its KV.
            tabs.pop().close()
            assert wait_for(lambda: metric(server, "dllm:num_requests_waiting") == 0)
            tabs[0].click("#stop")
            tabs[0].wait_for_selector("body[data-run=stopped]")
            assert "Stopped" in tabs[0].text_content("#message")
            assert wait_for(lambda: metric(server, "dllm:kv_cache_usage_perc") == 0.0
                            and metric(server, "dllm:num_requests_running") == 0
                            and metric(server, "dllm:num_requests_waiting") == 0)

            # The server dies mid-answer: the page says the connection dropped.
            tab = tabs[0]
            tab.click("#send")
            assert wait_for(lambda: metric(server, "dllm:kv_cache_usage_perc") > 0)
            server.stop(signal.SIGKILL)
            tab.wait_for_selector("body[data-run=failed]", timeout=30_000)
            assert "connection" in tab.text_content("#message").lower()
            assert not errors, errors
            browser.close()
    finally:
        server.stop()
