"""Debian's Chromium as the browser tests (`conftest.browser`) and the load benchmark
(`bench/bench_visitors.py`) launch it."""

from __future__ import annotations

CHROMIUM = "/usr/bin/chromium"
# Without the background-networking flags Chromium keeps dialling Google on a closed network.
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
