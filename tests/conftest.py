"""Shared fixtures: vLLM's environment for tests, the demo twins, and an event loop thread.

vLLM reads its environment when it is imported, and its engine processes inherit it, so the
variables are set here, before any test module imports vLLM.
"""

from __future__ import annotations

import asyncio
import atexit
import os
import shutil
import tempfile
import threading
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

# One OpenMP thread per process (torch's, in the tests' processes and every engine they start,
# which inherit it): the suite runs two workers on two cores, and an engine's two threads by
# default oversubscribed them (the app's own rule, `app.demo.models.engine_threads`, gives one
# here too; its measurement: docs/BENCHMARKS.md, "Two CPU engines at once"). Set before anything
# imports torch.
os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest
from hypothesis import settings
from zmq_contexts import keep_contexts_collected_open

from app.demo.models import use_local_vllm_environment

keep_contexts_collected_open()

# Property tests: the same examples on every run by default, so that CI's verdict is the code's,
# not the draw's; `HYPOTHESIS_PROFILE=deep` draws many more, at random (run it after a change
# to the scheduler: 2,000 traces take about 30 s).
settings.register_profile("ci", derandomize=True, max_examples=150)
settings.register_profile("deep", max_examples=2000)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

# One vLLM cache for the run, shared by the workers (made before pytest-xdist starts them, whose
# environment they inherit) and removed by the process that made it; see `vllm_model_infos`.
# `use_local_vllm_environment` keeps the cache root named here.
if "VLM_TESTS_VLLM_CACHE" not in os.environ:
    os.environ["VLM_TESTS_VLLM_CACHE"] = tempfile.mkdtemp(prefix="vllm-cache-")
    atexit.register(shutil.rmtree, os.environ["VLM_TESTS_VLLM_CACHE"], ignore_errors=True)
os.environ["VLLM_CACHE_ROOT"] = os.environ["VLM_TESTS_VLLM_CACHE"]
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
def vllm_model_infos() -> Path:
    """vLLM's model infos of every architecture the tests build, inspected at once
    (`tests/model_infos.py`): each engine test asks for it through `loop` or `tiny_cards`."""
    from engine_processes import start_engines_from_a_preloaded_server
    from model_infos import inspect_once

    from app.catalog.cards import load_cards
    from app.demo.twins import TWIN_BUILDERS

    cards, cache_root = load_cards(), Path(os.environ["VLLM_CACHE_ROOT"])
    inspect_once({cards[key].architecture for key in TWIN_BUILDERS}, cache_root)
    start_engines_from_a_preloaded_server()
    return cache_root


@pytest.fixture(scope="session")
def loop(vllm_model_infos: Path) -> Iterator[LoopThread]:
    thread = LoopThread()
    yield thread
    thread.close()


# The demo models, under the keys the engine tests use: twins of two real cards with different
# prompt formats (Qwen2-VL's and LLaVA-1.5's), random weights made by vLLM.
TINY_TWINS = {"tiny-a": "qwen2_vl", "tiny-b": "llava"}


@pytest.fixture(scope="session")
def tiny_cards(vllm_model_infos: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    from app.catalog.cards import load_cards
    from app.demo.models import twin_card
    from app.demo.twins import build_twin

    cards, root = load_cards(), tmp_path_factory.mktemp("tiny-twins")
    return {key: twin_card(cards[of], build_twin(cards[of], root), key) for key, of in TINY_TWINS.items()}


# Tests that run the real vLLM engine get their shared fixtures from here: any test that asks for
# one of these is an engine test, marked `slow` and `vllm` so that `make check` leaves it to
# `make test` (a test may also be marked by hand).
ENGINE_FIXTURES = {"loop", "tiny_cards", "vllm_model_infos"}
# A test that drives Chromium runs once more after one of its waits ran out (pytest-rerunfailures):
# about one suite run in two lately failed a browser test, a different one each time, none
# reproduced (docs/TESTING.md). Only a wait is rerun (`poll`'s "not true within", Playwright's
# TimeoutError): a plain assert about what the page or the server did fails at once. A failure
# that comes back fails the suite; every first failure is printed at the end of the run
# (`pytest_terminal_summary`), and the rerun starts from a quiet server (`quiet_before_a_rerun`).
BROWSER_RERUNS, RERUN_ONLY = 1, [r"not true within", r"TimeoutError"]


@pytest.hookimpl(wrapper=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> Iterator[None]:
    # Before the other plugins' hooks, so that `-m "not slow"` leaves the engine tests out.
    for item in items:
        if ENGINE_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)
            item.add_marker(pytest.mark.vllm)
        if "browser" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.flaky(reruns=BROWSER_RERUNS, only_rerun=RERUN_ONLY))
    yield
    # After them (pytest orders a module's tests by their fixtures' params): the longest groups
    # first, so that under `make test` short ones fill in at the end; a group's tests stay
    # together, so that a plain `pytest` run builds no engine twice either.
    groups = {item: work_group(item.nodeid) for item in items}
    first_seen: dict[str, int] = {}
    for index, item in enumerate(items):
        first_seen.setdefault(groups[item], index)
    rank = {group: place for place, group in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: (rank.get(groups[item], len(rank)), first_seen[groups[item]]))


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Each browser test's first failure, which a rerun followed: the failures' own section shows
    only the rerun's, and the plugin names the test alone. With the tail of what it captured
    (the server's and the engine's lines)."""
    stats = terminalreporter.stats
    failed = {report.nodeid for key in ("failed", "error") for report in stats.get(key, [])}
    for report in stats.get("rerun", []):
        then = "failed again (above)" if report.nodeid in failed else "passed"
        terminalreporter.write_sep("_", f"failed, then {then} when run again: {report.nodeid}")
        terminalreporter.write_line(str(report.longrepr))
        for name, text in report.sections:
            terminalreporter.write_line(f"--- {name} (its last 30 lines)")
            terminalreporter.write_line("\n".join(text.splitlines()[-30:]))


@pytest.fixture(autouse=True)
def quiet_before_a_rerun(request: pytest.FixtureRequest) -> None:
    """A browser test's rerun starts as the first try did: nothing held or capped by the test that
    failed, and no answer of its page still streaming (a page's answer ends when it closes)."""
    if getattr(request.node, "execution_count", 1) < 2 or "served" not in request.fixturenames:
        return
    from ui_pages import poll

    playground, _, factory = request.getfixturevalue("served")
    factory.release()
    factory.max_tokens_cap = None
    manager = playground.manager
    poll(
        lambda: (
            not any(factory.streaming.values())
            and not any(manager.unfinished_requests(key) for key in factory.engines)
        ),
        120,
    )


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """`make test` runs on two workers (pytest-xdist, `-n 2 --dist loadscope`), each taking a
    whole group at a time, in the order above. xdist's own groups (`--dist loadgroup`) are lost
    under pytest 9.2, which no longer reads the node id xdist 3.8 rewrites to name a group."""
    if config.getoption("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class ByWorkGroup(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return work_group(nodeid)

    return ByWorkGroup(config, log)


# The longest groups, measured with `--durations` (docs/TESTING.md): the browser modules, the
# engine modules that build many engines, the twins whose processors are slowest to start. A
# group missing here only starts later: it changes the suite's time, never its verdict.
LONGEST_FIRST = (
    "tests/test_ui_chat.py",
    "tests/test_ui_views.py",
    "tests/test_engine.py",
    "tests/test_grid.py",
    "tests/test_arena.py",
    "tests/test_shutdown.py",
    "tests/test_sign_in.py",
    "tests/test_seeing.py",
    "tests/test_twins.py[deepseek_vl_v2]",
    "tests/test_scheduler_sim.py",
    "tests/test_main.py",
    "tests/test_twins.py[ovis2_5]",
    "tests/test_twins.py[command_a_vision]",
    "tests/test_twins.py[ovis]",
    "tests/test_twins.py[deepseek_ocr]",
)
# Its engine is built per twin (a module fixture per param): each twin is a group of its own.
TWINS_MODULE = "tests/test_twins.py"


def work_group(nodeid: str) -> str:
    """What one worker runs together: a module, so that its engine or browser (module fixtures)
    is built once; but each twin apart, since the twins' module is a third of the suite."""
    module = nodeid.split("::")[0]
    if module == TWINS_MODULE and nodeid.endswith("]"):
        return f"{module}[{nodeid[nodeid.index('[') + 1 : -1]}]"
    return module


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


# The page's test bench (`ui_pages.py`), for the browser tests: a module's own server, and a
# fresh page per test. Imported on use, so that the tests without a page import no Gradio here.
@pytest.fixture(scope="module")
def served(tiny_cards: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from ui_pages import serve

    yield from serve(tiny_cards, tmp_path_factory)


@pytest.fixture
def open_page(browser: Any, served: Any) -> Iterator[Any]:
    from ui_pages import page_opener

    yield from page_opener(browser, served)


@pytest.fixture
def page(open_page: Any) -> Any:
    return open_page()
