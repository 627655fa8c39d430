"""Shared fixtures: vLLM's environment for tests, the demo twins, and an event loop thread.

vLLM reads its environment when it is imported, and its engine processes inherit it, so the
variables are set here, before any test module imports vLLM.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
import threading
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
from hypothesis import settings

from app.demo.models import use_local_vllm_environment

# Property tests: the same examples on every run by default, so that CI's verdict is the code's,
# not the draw's; `HYPOTHESIS_PROFILE=deep` draws many more, at random (run it after a change
# to the scheduler: 2,000 traces take about 30 s).
settings.register_profile("ci", derandomize=True, max_examples=150)
settings.register_profile("deep", max_examples=2000)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

use_local_vllm_environment(Path(tempfile.mkdtemp(prefix="vllm-tests-")))

T = TypeVar("T")


class LoopThread:
    """An asyncio loop in a thread that outlives single tests, so engines can be shared."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="test-loop", daemon=True)
        self._thread.start()

    def run(self, coroutine: Coroutine[Any, Any, T], timeout: float = 300) -> T:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)


@pytest.fixture(scope="session")
def loop() -> Iterator[LoopThread]:
    thread = LoopThread()
    yield thread
    thread.close()


# The demo models, under the keys the engine tests use: twins of two real cards with different
# prompt formats (Qwen2-VL's and LLaVA-1.5's), random weights made by vLLM.
TINY_TWINS = {"tiny-a": "qwen2_vl", "tiny-b": "llava"}


@pytest.fixture(scope="session")
def tiny_cards(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    from app.catalog.cards import load_cards
    from app.demo.models import twin_card
    from app.demo.twins import build_twin

    cards, root = load_cards(), tmp_path_factory.mktemp("tiny-twins")
    return {key: twin_card(cards[of], build_twin(cards[of], root), key) for key, of in TINY_TWINS.items()}


# Tests that run the real vLLM engine get their shared fixtures from here: any test that asks for
# one of these is an engine test, marked `slow` and `vllm` so that `make check` leaves it to
# `make test` (a test may also be marked by hand).
ENGINE_FIXTURES = {"loop", "tiny_cards"}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if ENGINE_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)
            item.add_marker(pytest.mark.vllm)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """Chromium for a module's browser tests: one per module, since Playwright's sync API holds
    the thread's event loop while it runs (the other modules' `asyncio.run` needs it free)."""
    from chromium import CHROMIUM, CHROMIUM_FLAGS
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS)
        yield chromium
        chromium.close()
