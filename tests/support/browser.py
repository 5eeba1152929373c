"""Headless Chromium (Debian's ``chromium`` package, ``make test`` installs it) for the
dashboard tests: load a page, let its scripts fetch and render, and read what it shows.

``--virtual-time-budget`` lets the page run its fetches and timers (virtual time advances only
while the page is idle, so every fetch completes first) before the DOM is dumped. As root a
headless Chromium needs ``--no-sandbox``. Every run is bounded by a timeout and has its own
profile directory, so runs never share state.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path

import pytest

CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--no-first-run",
    "--hide-scrollbars",
    "--virtual-time-budget=10000",
]


def available() -> bool:
    return Path(CHROMIUM).exists() or shutil.which(CHROMIUM) is not None


def require() -> None:
    """Fail (not skip) without Chromium: the dashboard's tests are part of the suite."""
    if not available():
        pytest.fail(
            f"Chromium is missing ({CHROMIUM}): `make test` installs it "
            "(apt-get install -y --no-install-recommends chromium)"
        )


def _run(args: list[str], timeout: float) -> subprocess.CompletedProcess[bytes]:
    with tempfile.TemporaryDirectory(prefix="pubsubd-chromium-") as profile:
        return subprocess.run(
            [CHROMIUM, *FLAGS, f"--user-data-dir={profile}", *args],
            capture_output=True,
            timeout=timeout,
            check=True,
        )


def dump_dom(url: str, timeout: float = 60.0) -> str:
    """The page's DOM after its scripts ran, as HTML."""
    return _run(["--dump-dom", url], timeout).stdout.decode()


def screenshot(url: str, path: Path, size: str = "1280,900", timeout: float = 60.0) -> None:
    _run([f"--window-size={size}", f"--screenshot={path}", url], timeout)
    if not path.exists():
        raise AssertionError(f"chromium wrote no screenshot of {url}")


@dataclass
class Shown:
    """What a dashboard page shows: its [data-metric] texts, its tables' rows by data-name
    (column -> cell text), in order, the text of every element with an id, where each link
    with an id leads (None: no href, a disabled control) and its <body> attributes."""

    metrics: dict[str, str] = field(default_factory=dict)
    formats: dict[str, str] = field(default_factory=dict)
    rows: dict[str, dict[str, dict[str, str]]] = field(default_factory=dict)  # table id -> ...
    texts: dict[str, str] = field(default_factory=dict)  # element id -> its text
    links: dict[str, str | None] = field(default_factory=dict)  # <a> id -> href
    body: dict[str, str] = field(default_factory=dict)
    error: str = ""


class _Reader(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.shown = Shown()
        self._open: list[tuple[str, str, str, str]] = []  # (tag, kind, key, id) collecting text
        self._text: dict[int, list[str]] = {}
        self._table = ""
        self._row = ""

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        if tag == "body":
            self.shown.body = a
        if tag == "table":
            self._table = a.get("id", "")
            self.shown.rows.setdefault(self._table, {})
        if tag == "tr":
            self._row = a.get("data-name", "")
        if tag == "a" and "id" in a:
            self.shown.links[a["id"]] = dict(attrs).get("href")
        kind, key = "", ""
        if "data-metric" in a:
            kind, key = "metric", a["data-metric"]
            self.shown.formats[key] = a.get("data-format", "text")
        elif tag == "td" and "data-col" in a and self._row:
            kind, key = "col", a["data-col"]
        elif a.get("id") == "error":
            kind, key = "error", ""
        self._open.append((tag, kind, key, a.get("id", "")))
        self._text[len(self._open)] = []

    def handle_endtag(self, tag: str) -> None:
        while self._open:
            depth = len(self._open)
            open_tag, kind, key, element_id = self._open.pop()
            text = "".join(self._text.pop(depth, [])).strip()
            if self._open:  # the text belongs to the enclosing elements too
                self._text.setdefault(depth - 1, []).append(text)
            if kind == "metric":
                self.shown.metrics[key] = text
            elif kind == "col":
                self.shown.rows[self._table].setdefault(self._row, {})[key] = text
            elif kind == "error":
                self.shown.error = text
            if element_id:
                self.shown.texts[element_id] = text
            if open_tag == tag:
                break

    def handle_data(self, data: str) -> None:
        if self._open:
            self._text[len(self._open)].append(data)


def read(html: str) -> Shown:
    reader = _Reader()
    reader.feed(html)
    reader.close()
    return reader.shown
