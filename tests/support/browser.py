"""Browser tests: Playwright for Python driving Debian's chromium (``make system-deps``).

Playwright never downloads a browser here: :func:`chromium_path` finds the system's
``chromium`` (``ROUTER_CHROMIUM`` names another binary), and a missing one fails the test
loudly, as a missing redis-server does.

Fixtures:

* ``browser`` (module scope): one headless chromium, closed when the module's last test
  is done. Not session scope on purpose: while Playwright's sync API is started it marks
  its own event loop as running in the main thread, so every async test (and every
  ``asyncio.run``) after it in the same worker would fail; a module's end stops it
  before another module's tests run. A launch costs about half a second.
* ``open_page`` (per test): ``open_page(base_url)`` opens a :class:`BrowserPage`, a page
  in a fresh context (no cookie of another page), 1400x900 unless ``viewport=`` says
  otherwise (:data:`PHONE_VIEWPORT`, 390x844). Every page it visits (:meth:`~BrowserPage.visit`,
  and every :meth:`~BrowserPage.shot`) is saved as
  ``test-artifacts/screenshots/<test>-<name>.png``, and the page as the test left it as
  ``<test>-last.png``, passed or failed. Errors the page's scripts raised, console
  errors and 5xx answers are kept in ``errors`` for the test to assert on.
  :meth:`~BrowserPage.cut_off_tables` tells the tables a reader could not see whole.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from playwright.sync_api import (
    Browser,
    BrowserContext,
    ConsoleMessage,
    Error as PlaywrightError,
    Page,
    Response,
    ViewportSize,
    sync_playwright,
)

OpenPage = Callable[..., "BrowserPage"]
SCREENSHOTS = Path(__file__).resolve().parents[2] / "test-artifacts" / "screenshots"
TIMEOUT_MS = 10_000
CLIENT_ERROR_LINE = re.compile(r"Failed to load resource: .* status of 4\d\d ")
DEFAULT_VIEWPORT: ViewportSize = {"width": 1400, "height": 900}
PHONE_VIEWPORT: ViewportSize = {"width": 390, "height": 844}


CUT_OFF_TABLES = """() => {
    // A shown table is whole when it fits its box, or its box scrolls sideways (overflow-x
    // auto or scroll) and that box fits the window; and the page itself never scrolls
    // sideways (what is past the right edge of a phone is cut off).
    const width = document.documentElement.clientWidth;
    const cut = [];
    for (const table of document.querySelectorAll("table")) {
        if (table.getClientRects().length === 0) continue;  // (not shown)
        let box = table.parentElement;
        let scrolls = false;
        for (let el = box; el && el !== document.body; el = el.parentElement) {
            const overflow = getComputedStyle(el).overflowX;
            if (overflow === "auto" || overflow === "scroll") { box = el; scrolls = true; break; }
        }
        const name = table.dataset.test || table.outerHTML.slice(0, 60);
        if (!scrolls && table.scrollWidth > box.clientWidth + 1) {
            cut.push(`${name}: ${table.scrollWidth} px in a box of ${box.clientWidth} px`);
        } else if (box.getBoundingClientRect().right > width + 1) {
            const right = box.getBoundingClientRect().right;
            cut.push(`${name}: its box ends at ${right} px of ${width}`);
        }
    }
    if (document.documentElement.scrollWidth > width + 1) {
        cut.push(`the page: ${document.documentElement.scrollWidth} px wide in ${width}`);
    }
    return cut;
}"""
"""JavaScript: the tables of the page a reader cannot see whole (see
:meth:`BrowserPage.cut_off_tables`)."""


def chromium_path() -> str:
    """The chromium binary to drive; fails the test when there is none."""
    named = os.environ.get("ROUTER_CHROMIUM")
    found = named or shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None or not os.access(found, os.X_OK):
        pytest.fail(
            f"no chromium binary ({named or 'chromium on PATH'}): `make system-deps` installs "
            "Debian's (Playwright's own browsers are never downloaded)"
        )
    return found


def artifact_name(text: str) -> str:
    """``text`` made safe as a file name (a test's id has brackets and slashes)."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text).strip("_")


@dataclass
class BrowserPage:
    """A test's page on one base URL (``http://host:port/``); ``errors`` collects the
    page's script errors, console errors and 5xx answers."""

    page: Page
    base_url: str
    test_name: str
    errors: list[str] = field(default_factory=list)
    saved: list[Path] = field(default_factory=list)

    def visit(self, route: str, ready: str, name: str | None = None) -> Page:
        """Open ``base_url + route`` (``"#/nodes"``), wait until ``ready`` (a selector)
        is visible, and save a screenshot named ``name`` (default: the route's words)."""
        self.page.goto(self.base_url + route)
        self.page.locator(ready).first.wait_for(state="visible")
        self.shot(name or artifact_name(route.lstrip("#/")) or "index")
        return self.page

    def shot(self, name: str) -> Path:
        """Save the page as it is now: ``test-artifacts/screenshots/<test>-<name>.png``."""
        path = SCREENSHOTS / f"{artifact_name(self.test_name)}-{artifact_name(name)}.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        self.page.screenshot(path=str(path), full_page=True)
        self.saved.append(path)
        return path

    def cut_off_tables(self) -> list[str]:
        """What is cut off on the page as shown now: each table neither fitting its box
        nor in a box that scrolls sideways within the window, and the page if it is
        wider than the window; empty when everything can be read."""
        found: list[str] = self.page.evaluate(CUT_OFF_TABLES)
        return found

    def _console(self, message: ConsoleMessage) -> None:
        """A console error, but chromium's line for each 4xx answer: the dashboard asks
        for some on purpose (``/me`` before the login) and shows the others itself."""
        if message.type == "error" and not CLIENT_ERROR_LINE.match(message.text):
            self.errors.append(f"console: {message.text}")

    def _response(self, response: Response) -> None:
        if response.status >= 500:
            self.errors.append(f"HTTP {response.status}: {response.request.method} {response.url}")


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    """A headless Debian chromium for the module's tests."""
    executable = chromium_path()
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(
            executable_path=executable, headless=True, args=["--no-sandbox"]
        )
        try:
            yield launched
        finally:
            launched.close()


@pytest.fixture
def open_page(browser: Browser, request: pytest.FixtureRequest) -> Iterator[OpenPage]:
    """Open pages for one test: ``open_page(base_url, viewport=..., label=...)`` gives a
    :class:`BrowserPage` in a fresh context (no cookie of another page); each is saved as
    ``<test>[-label]-last.png`` and closed after the test."""
    opened: list[tuple[BrowserContext, BrowserPage]] = []

    def open_one(
        base_url: str, *, viewport: ViewportSize = DEFAULT_VIEWPORT, label: str = ""
    ) -> BrowserPage:
        context = browser.new_context(viewport=viewport)
        context.set_default_timeout(TIMEOUT_MS)
        page = context.new_page()
        name = request.node.name + (f"-{label}" if label else "")
        shown = BrowserPage(page, base_url, name)
        page.on("pageerror", lambda error: shown.errors.append(f"script: {error}"))
        page.on("console", shown._console)
        page.on("response", shown._response)
        opened.append((context, shown))
        return shown

    try:
        yield open_one
    finally:
        for context, shown in opened:
            with contextlib.suppress(PlaywrightError):  # (gone with what failed the test)
                shown.shot("last")
            context.close()
