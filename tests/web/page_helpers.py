"""Driving the chat page in Debian's Chromium with Playwright (tests/web/).

Never a downloaded browser: :data:`CHROMIUM` is the system's, started headless with the flags that keep it off
the network (no background requests, no component updates), each test in a fresh context (its own IndexedDB,
localStorage and sessionStorage). :class:`Watched` records every request the page makes and every console
message, so a test can assert that nothing left the machine and that the Content-Security-Policy blocked
nothing of the page's own.
"""
from __future__ import annotations

import os
import shutil
import time
from dataclasses import dataclass, field

CHROMIUM = shutil.which("chromium") or ("/usr/bin/chromium" if os.path.exists("/usr/bin/chromium") else None)
"""Debian's Chromium, or None (the tests then skip, saying so)."""
ARGS = ["--no-sandbox", "--headless=new", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync",
        "--disable-dev-shm-usage"]
ANSWER_TIMEOUT_MS = 240_000
"""A guard for one answer of a tiny model on a shared 2-core machine (never a performance bound)."""


@dataclass
class Watched:
    """A page with what it asked for and what its console said."""

    page: object
    requests: list[str] = field(default_factory=list)
    console: list[str] = field(default_factory=list)

    def csp_violations(self) -> list[str]:
        return [m for m in self.console if "Content Security Policy" in m or "Content-Security-Policy" in m]


def wait_until(page, expression: str, timeout_ms: float = ANSWER_TIMEOUT_MS):
    """Poll the JavaScript ``expression`` until it is truthy; return its value. (Playwright's
    ``wait_for_function`` evaluates a string with ``eval``, which the page's CSP refuses, as it should.)"""
    deadline = time.monotonic() + timeout_ms / 1000
    while True:
        value = page.evaluate(expression)
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"{expression!r} still false after {timeout_ms / 1000:.0f} s")
        time.sleep(0.05)


def open_page(context, url: str) -> Watched:
    """A new page of ``context`` at ``url`` once the app has started (``body[data-ready]``)."""
    page = context.new_page()
    w = Watched(page)
    page.on("request", lambda r: w.requests.append(r.url))
    page.on("console", lambda m: w.console.append(f"{m.type}: {m.text}"))
    page.on("pageerror", lambda e: w.console.append(f"pageerror: {e}"))
    page.goto(url)
    page.wait_for_selector("body[data-ready='1']", timeout=60_000)
    return w


def pick_model(page, name: str) -> None:
    """Choose ``name`` (``:latest`` when it has no tag) in the model picker."""
    page.select_option("#model", name if ":" in name else f"{name}:latest")


def send(page, text: str) -> None:
    """Type ``text`` in the composer (newlines as Shift+Enter) and press Enter."""
    box = page.locator("#input")
    box.click()
    for i, line in enumerate(text.split("\n")):
        if i:
            box.press("Shift+Enter")
        if len(line) < 40:
            box.type(line)
        else:  # typing key by key is slow: longer lines are added at once
            box.evaluate("(el, t) => { el.value += t; }", line)
    box.press("Enter")


def mark_answers(page) -> None:
    """Mark the answers on the page now, so that :func:`wait_new_answer` can tell a new one from them."""
    page.evaluate("document.querySelectorAll('.msg.assistant').forEach(e => { e.dataset.old = '1'; })")


def wait_new_answer(page) -> dict:
    """After :func:`mark_answers` and an action that answers again: wait for an unmarked answer to finish."""
    wait_until(page, "document.querySelector('.msg.assistant:not([data-old])')")
    return wait_answer(page)


def last_answer(page):
    return page.locator(".msg.assistant").last


def wait_answer(page, n: int | None = None) -> dict:
    """Wait until no answer is streaming (and, with ``n``, until there are ``n`` answers); return the last
    answer's text, error, stats figures and whether it was stopped."""
    if n is not None:
        wait_until(page, f"document.querySelectorAll('.msg.assistant').length >= {n}")
    wait_until(page, "!document.querySelector('.msg.streaming') && !document.querySelector('#send').hidden")
    a = last_answer(page)
    stats = a.locator(".stats[data-prompt]")
    return {
        "text": a.locator(".content").inner_text(),
        "error": a.locator(".error-text").inner_text() if a.locator(".error-text").count() else "",
        "stopped": a.locator(".stopped").count() > 0,
        "prompt": int(stats.get_attribute("data-prompt")) if stats.count() else None,
        "cached": int(stats.get_attribute("data-cached")) if stats.count() else None,
        "stats": stats.inner_text() if stats.count() else "",
    }
