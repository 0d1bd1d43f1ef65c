"""The chat page at ``/`` in a real browser: Debian's Chromium driven by Playwright, against ``ollapy serve`` on the
real test models (SmolLM2 and the Gemma 3 base model).

Each test opens the page in a fresh browser context and asserts what a person sees: an answer that streams and
can be stopped, the conversation after a reload, a model switch, a server error as a message, the API key
dialog, the prompt-cache figures of a second identical question, a model's XSS payload shown as text, edit and
resend, regenerate, thinking folded, export and import, a pull with its progress bar, an image for a vision
model. Every test also checks that the page made no request off the machine and that its CSP blocked nothing of
its own. With ``OLLAPY_WEB_SCREENSHOTS=1`` they also write the screenshots of the main states in docs/screenshots/.
"""
from __future__ import annotations

import json
import os
import time

import httpx
import pytest
from conftest import ROOT, live_api, live_server
from fake_registry import FakeRegistry
from page_helpers import (
    ANSWER_TIMEOUT_MS,
    ARGS,
    CHROMIUM,
    mark_answers,
    open_page,
    pick_model,
    send,
    wait_answer,
    wait_new_answer,
    wait_until,
)
from think_models import EXAMPLE, THINK_TEMPLATE, THINKING

pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed (apt-get install -y chromium)")
SHOTS = ROOT / "docs" / "screenshots"
SHORT = {"temperature": 0, "num_predict": 48}
Q = "What is the capital of France? Answer in one word."
# a completion-style prompt: Gemma 3's base model continues the pattern and copies the payload (with its own
# numbers), so the XSS comes from real model output, not from the test
ECHO_TEMPLATE = "{{ range .Messages }}{{ .Content }}{{ end }}"
PAYLOAD = '<img src=x onerror="window.__xss=1"> <script>window.__xss=2</script> [click me](javascript:window.__xss=3)'
ECHO_PROMPT = ("Copy each input line to the output unchanged.\nInput: <b>bold</b> text\nOutput: <b>bold</b> text\n"
               "Input: see [docs](https://example.com/a) now\nOutput: see [docs](https://example.com/a) now\n"
               f"Input: {PAYLOAD}\nOutput:")


def shot(page, name: str) -> None:
    if os.environ.get("OLLAPY_WEB_SCREENSHOTS", "0") == "1":
        SHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SHOTS / f"{name}.png"))


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    pw = sync_playwright().start()
    b = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS)
    yield b
    b.close()
    pw.stop()


@pytest.fixture
def context(browser):
    ctx = browser.new_context(viewport={"width": 1180, "height": 760}, accept_downloads=True)
    ctx.set_default_timeout(60_000)
    yield ctx
    ctx.close()


@pytest.fixture(scope="module")
def registry(smollm2_draft_path):
    """A registry with ``tiny``: a real GGUF cut from SmolLM2 (its blob is not in the store yet), sent slowly
    enough to watch the progress bar."""
    with FakeRegistry() as reg:
        reg.rate = 12_000_000  # bytes/s
        reg.add_model("library", "tiny", "latest", smollm2_draft_path, params=SHORT)
        yield reg


@pytest.fixture(scope="module")
def site(tmp_path_factory, smollm2_path, gemma_path, registry):
    """``ollapy serve`` with smol, smol-b (answers in French), smol-long, smol-think and echo (Gemma base)."""
    base = tmp_path_factory.mktemp("webui")
    models = {"smol": {"parameters": SHORT},
              "smol-b": {"parameters": SHORT, "system": "You always answer in French."},
              "smol-long": {"parameters": {"temperature": 0, "num_predict": 900}},
              "smol-think": {"parameters": {**SHORT, "num_predict": 40}, "template": THINK_TEMPLATE, "messages": EXAMPLE}}
    with live_api(base, smollm2_path, models, env={"OLLAPY_REGISTRY": registry.url}) as api:
        blob = api.oc.create_blob(gemma_path)
        api.oc.create(model="echo", files={"model.gguf": blob}, template=ECHO_TEMPLATE,
                      parameters={"temperature": 0, "num_predict": 80, "stop": ["\n"]})
        yield api


def assert_clean(w, url: str) -> None:
    """Nothing left the machine; the CSP blocked nothing of the page's own; no script error."""
    off = [u for u in w.requests if not (u.startswith(url + "/") or u == url or u.startswith(("data:", "blob:")))]
    assert off == []
    assert w.csp_violations() == []
    assert [m for m in w.console if m.startswith("pageerror")] == []


def test_a_browser_gets_the_page_and_every_other_client_the_text(site, tmp_path):
    html = httpx.get(site.url + "/", headers={"Accept": "text/html,application/xhtml+xml"})
    assert html.status_code == 200 and "<title>ollapy</title>" in html.text
    csp = html.headers["content-security-policy"]
    assert "script-src 'self'" in csp and "unsafe-inline" not in csp and "connect-src 'self'" in csp
    assert httpx.get(site.url + "/").text == "Ollama is running (ollapy)"
    assert httpx.get(site.url + "/", headers={"Accept": "application/json"}).text == "Ollama is running (ollapy)"
    js = httpx.get(site.url + "/web/app.js")
    assert js.status_code == 200 and js.headers["content-type"].startswith("text/javascript")
    assert httpx.get(site.url + "/web/__init__.py").status_code == 404
    assert httpx.get(site.url + "/web/../config.py").status_code == 404
    versions = httpx.get(site.url + "/web/vendor/VERSIONS").text
    assert "marked" in versions and "dompurify" in versions and "highlightjs" in versions
    with live_server(tmp_path, "--no-webui") as url:
        assert httpx.get(url + "/", headers={"Accept": "text/html"}).text == "Ollama is running (ollapy)"
        assert httpx.get(url + "/web/app.js").status_code == 404
    with live_server(tmp_path / "env", env={"OLLAPY_NO_WEBUI": "1"}) as url:
        assert httpx.get(url + "/", headers={"Accept": "text/html"}).text == "Ollama is running (ollapy)"


def test_an_answer_streams_and_survives_a_reload(site, context):
    w = open_page(context, site.url)
    page = w.page
    pick_model(page, "smol")
    send(page, Q)
    # the answer grows in place while the Stop button shows: seen at least twice with different text
    seen = set()
    deadline = time.monotonic() + ANSWER_TIMEOUT_MS / 1000
    while time.monotonic() < deadline:
        text, stop_shown = page.evaluate("[document.querySelector('.msg.streaming .content')?.innerText ?? null,"
                                         " !document.querySelector('#stop').hidden]")
        if text is None and seen:
            break
        if text:
            seen.add(text)
            assert stop_shown
        time.sleep(0.02)
    assert len(seen) >= 2, seen
    a = wait_answer(page)
    assert "Paris" in a["text"] and a["error"] == ""
    assert a["prompt"] > 0 and "tok/s" in a["stats"] and "TTFT" in a["stats"]
    shot(page, "chat-light")
    page.reload()
    page.wait_for_selector("body[data-ready='1']")
    assert page.locator("#conversations li.active .title").inner_text().startswith("What is the capital")
    assert page.locator(".msg.user .body").inner_text() == Q
    assert "Paris" in page.locator(".msg.assistant .content").inner_text()
    assert_clean(w, site.url)


def test_stop_ends_a_long_answer(site, context):
    w = open_page(context, site.url)
    page = w.page
    pick_model(page, "smol-long")
    send(page, "Write a long story about a dragon who learns to bake bread.")
    wait_until(page, "(document.querySelector('.msg.streaming .content')?.innerText || '').length > 20")
    page.click("#stop")
    a = wait_answer(page)
    assert a["stopped"] and a["prompt"] is None
    time.sleep(1.0)
    assert page.locator(".msg.assistant .content").inner_text() == a["text"]  # nothing more arrived
    # the server let the slot go: a next question is answered
    ps = httpx.get(site.url + "/api/ps").json()["models"]
    assert all(m["active_requests"] == 0 for m in ps if m["name"].startswith("smol-long"))
    assert_clean(w, site.url)


def test_switching_models_answers_with_the_new_one(site, context):
    w = open_page(context, site.url)
    page = w.page
    pick_model(page, "smol")
    send(page, Q)
    first = wait_answer(page, 1)
    pick_model(page, "smol-b")
    send(page, Q)
    second = wait_answer(page, 2)
    roles = page.locator(".msg.assistant .role").all_inner_texts()
    assert roles == ["smol:latest", "smol-b:latest"]
    assert second["text"] != first["text"]  # the French system prompt of smol-b
    assert any(m["name"].startswith("smol-b") for m in httpx.get(site.url + "/api/ps").json()["models"])
    assert_clean(w, site.url)


def test_a_missing_model_is_an_error_message(site, context):
    site.oc.copy("smol", "doomed")
    w = open_page(context, site.url)
    page = w.page
    pick_model(page, "doomed")
    site.oc.delete("doomed")
    send(page, Q)
    a = wait_answer(page, 1)
    assert "not found" in a["error"] and "doomed" in a["error"]
    assert page.locator("#banner").is_visible() and "not found" in page.locator("#banner").inner_text()
    shot(page, "error")
    assert_clean(w, site.url)


def test_the_same_question_twice_shows_the_prompt_cache(site, context):
    w = open_page(context, site.url)
    page = w.page
    pick_model(page, "smol")
    question = "Name three colours of the rainbow. Answer briefly."
    send(page, question)
    first = wait_answer(page, 1)
    page.click("#new-chat")
    send(page, question)
    second = wait_answer(page, 1)
    assert second["prompt"] == first["prompt"]
    assert second["cached"] > first["cached"] and second["cached"] >= second["prompt"] - 64
    assert f"{second['cached']} from cache" in second["stats"]
    shot(page, "prompt-cache")
    assert_clean(w, site.url)


def test_xss_in_model_output_stays_text(site, context):
    w = open_page(context, site.url)
    page = w.page
    pick_model(page, "echo")
    page.evaluate("t => { document.querySelector('#input').value = t; }", ECHO_PROMPT)
    page.press("#input", "End")
    page.press("#input", "Enter")
    a = wait_answer(page, 1)
    content = page.locator(".msg.assistant .content")
    # the model really wrote the payload (Gemma copies it with its own numbers)
    assert "<img src=" in a["text"] and "onerror=" in a["text"] and "<script>" in a["text"], a["text"]
    assert content.locator("img, script, iframe, object, embed, style").count() == 0
    assert page.evaluate("window.__xss") is None
    hrefs = content.locator("a").evaluate_all("els => els.map(e => e.getAttribute('href'))")
    assert not any(h and h.lower().startswith("javascript:") for h in hrefs)
    on_attrs = page.evaluate("""[...document.querySelectorAll('#messages *')].flatMap(
        e => [...e.attributes].map(a => a.name)).filter(n => n.startsWith('on'))""")
    assert on_attrs == []
    shot(page, "xss-as-text")
    assert_clean(w, site.url)


def test_edit_resend_regenerate_and_enter_keys(site, context):
    w = open_page(context, site.url)
    page = w.page
    pick_model(page, "smol")
    send(page, "Say hello.\nThen say goodbye.")
    wait_answer(page, 1)
    assert page.locator(".msg.user .body").inner_text() == "Say hello.\nThen say goodbye."
    page.click(".msg.user .edit")
    page.fill(".msg.user .edit-box textarea", Q)
    mark_answers(page)
    page.click(".msg.user .resend")
    a = wait_new_answer(page)
    assert page.locator(".msg.user").count() == 1 and page.locator(".msg.assistant").count() == 1
    assert page.locator(".msg.user .body").inner_text() == Q and "Paris" in a["text"]
    mark_answers(page)
    page.click(".msg.assistant .regenerate")
    b = wait_new_answer(page)
    assert page.locator(".msg.assistant").count() == 1 and b["text"] == a["text"]  # greedy: the same answer again
    assert b["cached"] > 0
    assert_clean(w, site.url)


def test_thinking_is_folded(site, context):
    w = open_page(context, site.url)
    page = w.page
    pick_model(page, "smol-think")
    send(page, "What is the capital of France?")
    a = wait_answer(page, 1)
    details = page.locator(".msg.assistant details.thinking")
    assert details.count() == 1 and details.get_attribute("open") is None
    assert not page.locator(".msg.assistant .thinking-text").is_visible()
    page.click(".msg.assistant details.thinking summary")
    assert THINKING in page.locator(".msg.assistant .thinking-text").inner_text()
    assert "Paris" in a["text"]
    shot(page, "thinking")
    assert_clean(w, site.url)


def test_dark_theme_code_block_and_copy(site, context):
    context.grant_permissions(["clipboard-read", "clipboard-write"], origin=site.url)
    w = open_page(context, site.url)
    page = w.page
    page.click("#theme")
    assert page.evaluate("document.documentElement.classList.contains('dark')")
    pick_model(page, "smol")
    send(page, "Write a Python function that adds two numbers.")
    wait_answer(page, 1)
    code = page.locator(".msg.assistant pre code")
    assert code.count() >= 1 and code.first.locator("span[class^='hljs-']").count() > 0  # highlighted
    page.click(".msg.assistant pre .copy")
    assert page.evaluate("navigator.clipboard.readText()") == code.first.inner_text()
    shot(page, "chat-dark-code")
    page.reload()
    page.wait_for_selector("body[data-ready='1']")
    assert page.evaluate("document.documentElement.classList.contains('dark')")  # the choice is kept
    assert_clean(w, site.url)


def test_export_and_import(site, browser, context, tmp_path):
    w = open_page(context, site.url)
    page = w.page
    pick_model(page, "smol")
    send(page, Q)
    wait_answer(page, 1)
    with page.expect_download() as dl:
        page.click("#export")
    path = tmp_path / "export.json"
    dl.value.save_as(path)
    data = json.loads(path.read_text())
    assert data["conversations"][0]["messages"][0]["content"] == Q
    fresh = browser.new_context()
    try:
        w2 = open_page(fresh, site.url)
        assert w2.page.locator("#conversations li .title").count() == 0 or \
            w2.page.locator("#conversations li .title").all_inner_texts() == ["New chat"]
        w2.page.set_input_files("#import", str(path))
        w2.page.wait_for_selector(f"#conversations li .title:text-is('{Q}')")
        w2.page.click(f"#conversations li .title:text-is('{Q}')")
        assert "Paris" in w2.page.locator(".msg.assistant .content").inner_text()
    finally:
        fresh.close()
    assert_clean(w, site.url)


def test_models_view_pulls_lists_deletes_and_shows_loaded(site, context):
    w = open_page(context, site.url)
    page = w.page
    page.click("#show-models")
    page.fill("#pull-name", "tiny")
    page.click("#pull")
    # the bar moves: a value between 0 and its max seen while the pull runs
    wait_until(page, "(() => { const p = document.querySelector('#pull-progress');"
                     " return p.value > 0 && p.value < p.max; })()", 120_000)
    shot(page, "models-pull")
    wait_until(page, "document.querySelector('#pull-status').innerText.includes('success')")
    page.wait_for_selector("#model-list tr[data-model='tiny:latest']")
    assert page.locator("#loaded-list tr").count() >= 1  # models the other tests loaded
    shot(page, "models")
    page.click("#back-to-chat")
    # the chat's model picker is refilled right after the models view (onModelsChanged): wait for it, not a race
    page.wait_for_selector("#model option[value='tiny:latest']", state="attached", timeout=30_000)
    assert "tiny:latest" in page.locator("#model option").all_inner_texts()
    page.click("#show-models")
    page.click("#model-list tr[data-model='tiny:latest'] .delete")
    page.click("#model-list tr[data-model='tiny:latest'] .delete")  # the second click confirms
    page.wait_for_selector("#model-list tr[data-model='tiny:latest']", state="detached")
    assert "tiny:latest" not in [m.model for m in site.oc.list().models]
    assert_clean(w, site.url)


def test_the_api_key_is_asked_and_kept_for_the_tab(tmp_path, smollm2_path, context):
    import ollama

    key = "s3cret-key"
    with live_server(tmp_path, env={"OLLAPY_API_KEY": key}) as url:
        oc = ollama.Client(host=url, headers={"Authorization": f"Bearer {key}"})
        oc.create(model="smol", files={"model.gguf": oc.create_blob(smollm2_path)}, parameters=SHORT)
        assert httpx.get(url + "/web/app.js").status_code == 200  # the page's files are public code
        assert httpx.get(url + "/api/tags").status_code == 401  # the API is not
        page = context.new_page()
        requests = []
        page.on("request", lambda r: requests.append(r.url))
        page.goto(url)
        page.wait_for_selector("#key-dialog[open]")
        shot(page, "api-key")
        page.fill("#key-input", "wrong")
        page.press("#key-input", "Enter")
        page.wait_for_selector("#key-error:not([hidden])")
        assert "refused" in page.locator("#key-error").inner_text()
        page.fill("#key-input", key)
        page.click("#key-save")
        page.wait_for_selector("body[data-ready='1']")
        assert page.locator("#model option").all_inner_texts() == ["smol:latest"]
        send(page, Q)
        assert "Paris" in wait_answer(page, 1)["text"]
        assert page.evaluate("sessionStorage.getItem('ollapy.apiKey')") == key
        assert key not in json.dumps(page.evaluate("Object.entries(localStorage)"))
        # another tab of the same browser asks again: the key is kept for its tab only
        other = context.new_page()
        other.goto(url)
        other.wait_for_selector("#key-dialog[open]")
        assert all(u.startswith(url) or u.startswith("data:") for u in requests)


def test_an_image_goes_to_a_vision_model(tmp_path, smollm2_path, context):
    """SmolLM2 with the synthetic projector of tests/test_vision_server.py: an attached picture reaches the model
    (its prompt grows by the image's tokens), shows in the question, and is kept across a reload."""
    from tests.test_vision_engine import _script, picture
    from tests.test_vision_server import install_vision_model

    proj = _script().write_projector(tmp_path / "mmproj.gguf", "gemma3", 0, 576)
    install_vision_model(tmp_path / "models", smollm2_path, proj)
    png = tmp_path / "picture.png"
    png.write_bytes(picture(1))
    with live_server(tmp_path, "-o", "num_predict=12", "-o", "temperature=0") as url:
        w = open_page(context, url)
        page = w.page
        pick_model(page, "vis")
        send(page, "Describe it.")
        text_only = wait_answer(page, 1)
        page.click("#new-chat")
        page.set_input_files("#attach", str(png))
        page.wait_for_selector("#attachments .thumb img")
        send(page, "Describe it.")
        with_image = wait_answer(page, 1)
        assert with_image["error"] == "" and with_image["prompt"] > text_only["prompt"]
        assert page.locator(".msg.user .images img").count() == 1
        assert page.locator("#attachments .thumb").count() == 0  # sent: the composer is empty again
        shot(page, "image")
        page.reload()
        page.wait_for_selector("body[data-ready='1']")
        assert page.locator(".msg.user .images img").count() == 1
        assert page.locator(".msg.user .images img").evaluate("img => img.naturalWidth") == 50  # it still decodes
        assert_clean(w, url)
