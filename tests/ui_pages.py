"""The page's test bench, shared by the browser tests (`test_ui_chat.py`, `test_ui_views.py`):
the real Gradio server on the demo twins and the seeing model, a page per test in Debian's
Chromium, and the helpers that drive it. Screenshots of the main views go to
test-artifacts/screenshots/ (`make screenshots`: to docs/screenshots/, the README's).

Each test module gets its own server and browser (module fixtures), so the two modules run on
two workers side by side; each test opens its own page (its own session). The twins answer
nonsense, so the tests check what the app does around them.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Browser, Page
from ports import free_port

from app.catalog.cards import ModelCard, load_cards
from app.config import Settings
from app.demo.models import SECOND_FOLDER, SEEING_FOLDER, SEEING_MODELS
from app.demo.seeing_llava import SECOND_BASE_CARD, SECOND_KEY, second_card
from app.demo.seeing_model import BASE_CARD, SEEING_KEY, seeing_card
from app.engines.base import SamplingSettings, StreamEnd
from app.engines.manager import EngineManager
from app.engines.vllm_engine import VllmEngineFactory
from app.media.loading import VideoDecoderPool
from app.storage.history import History, sqlite_url
from app.views import Playground, build, launch
from app.views.chat import WAITING

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "static" / "examples"
# Tests leave the tracked tree clean: screenshots go to test-artifacts/ (ignored), and into the
# README's folder only when asked (`make screenshots`).
SCREENSHOTS = ROOT / ("docs" if os.environ.get("UPDATE_SCREENSHOTS") else "test-artifacts") / "screenshots"
UPLOAD_LIMIT = 5 * 10**6
TINY_A, TINY_B, GREEDY = "demo_qwen2_vl", "demo_llava", "greedy_twin"
# Their labels in the model pickers: twins of Qwen2-VL and LLaVA-1.5, two prompt formats.
LABEL_A, LABEL_B = "Qwen2-VL 7B Instruct: random-weight twin", "LLaVA 1.5 7B: random-weight twin"


class RecordingFactory(VllmEngineFactory):
    """The app's factory, keeping the engines it builds so a test can kill one's process. Its
    engines run every answer to its max tokens: the twins' random weights sample about evenly
    over a vocabulary of some 500 tokens, so an answer may end on its end-of-sequence token at
    any point, and the tests that stop or kill an answer mid-way need it still running."""

    def __init__(self, settings: Settings) -> None:
        super().__init__(settings)
        self.engines: dict[str, Any] = {}
        self.asked: list[Any] = []  # the messages of every request, in order
        self.sampled: list[SamplingSettings] = []  # and the sampling each was sent with
        self.streaming: Counter[str] = Counter()  # answers in flight, by model key
        self.streamed: Counter[str] = Counter()  # pieces of answers handed on, by model key
        # A test whose answers go at the app's own length (the arena has no length control: 512
        # tokens, each streamed into the page) may cap them; None: as asked.
        self.max_tokens_cap: int | None = None
        self.endings: list[str] = []  # how each answer's stream ended: "ended" or "closed" before it
        # `hold_after`: answers past the first few wait, before their first token, until released
        # (a test that must catch a run part-way, on a machine of any speed).
        self._let_through: int | None = None  # None: none held
        self._gate = threading.Lock()  # the test's thread releases, the server's loop counts
        # `pause_after`: each answer hands on this many pieces, then waits until released.
        self._pieces_before_pause: int | None = None

    def hold_after(self, answers: int) -> None:
        """The next `answers` answers go on; any asked after them wait until `release`. A held
        answer has not reached vLLM, so an abort (Stop, a drain) only takes once it is released:
        release before anything waits for the engine to empty."""
        with self._gate:
            self._let_through = answers

    def pause_after(self, pieces: int) -> None:
        """Answers asked from now hand on `pieces` pieces (fewer, if their end comes first), then
        wait before the next until `release`: a test that must stop an answer mid-way, however
        fast the engine writes it (a 4,096-token answer could end before the page's Stop was
        pressed). The request stays in vLLM, which finishes it meanwhile; what the page can still
        do is close the stream before its end (`endings`)."""
        self._pieces_before_pause = pieces

    def release(self) -> None:
        with self._gate:
            self._let_through = None
        self._pieces_before_pause = None

    def _held(self) -> bool:
        """Whether an answer asked now waits for `release`."""
        with self._gate:
            if self._let_through is None:
                return False
            self._let_through -= 1
            return self._let_through < 0

    async def build(self, card: Any, report: Callable[[str], None], devices: tuple[int, ...] = (0,)) -> Any:
        engine = await super().build(card, report, devices)
        generate = engine.generate

        async def to_max_tokens(
            card: Any, messages: Any, sampling: SamplingSettings, request_id: str
        ) -> AsyncIterator[Any]:
            self.asked.append(messages)
            if card.key not in SEEING_MODELS:  # the trained models' answers end where they end them
                sampling = replace(sampling, ignore_eos=True)
            if (cap := self.max_tokens_cap) is not None:  # sampling is filled in by now
                sampling = replace(sampling, max_tokens=min(sampling.max_tokens or cap, cap))
            self.sampled.append(sampling)
            held, pause_at = self._held(), self._pieces_before_pause
            self.streaming[card.key] += 1
            ending, handed = "closed", 0
            try:
                while held and self._let_through is not None:
                    await asyncio.sleep(0.05)
                async with contextlib.aclosing(generate(card, messages, sampling, request_id)) as parts:
                    async for part in parts:
                        pausing = pause_at is not None and (handed >= pause_at or isinstance(part, StreamEnd))
                        while pausing and self._pieces_before_pause is not None:
                            await asyncio.sleep(0.05)
                        self.streamed[card.key] += 1
                        handed += 1
                        yield part
                ending = "ended"
            finally:
                self.streaming[card.key] -= 1
                self.endings.append(ending)

        engine.generate = to_max_tokens
        self.engines[card.key] = engine
        return engine


def serve(
    tiny_cards: dict[str, ModelCard], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Playground, str, RecordingFactory]]:
    settings = Settings(
        gpu_count=0,
        port=free_port(),
        max_resident=1,
        idle_unload_s=0,
        drain_timeout_s=30,
        queue_size=16,
        concurrency=8,
        # Every page here is a visitor at 127.0.0.1, some with answers still running from the
        # tests before (`app.views.fairness` is tested in test_api_sessions and test_strangers).
        answers_per_address=1000,
        requests_per_address_per_minute=1_000_000,
        waiting_per_address=16,  # the queue's size: no share (`app.views.doorway`)
        max_upload_bytes=UPLOAD_LIMIT,
        default_model=TINY_A,
        # Long enough for a reload, short enough for a test to see a closed tab's files go.
        reload_grace_s=20,
        # The arena's battles: the two twins, whose prompt formats differ.
        arena_models=(TINY_A, TINY_B),
    )
    greedy = {"temperature": 0.0, "max_tokens": 8192}
    cards = {
        TINY_A: tiny_cards["tiny-a"].model_copy(update={"key": TINY_A}),
        TINY_B: tiny_cards["tiny-b"].model_copy(update={"key": TINY_B}),
        # A servable card with its own sampling defaults, like DeepSeek-OCR's (which needs a GPU).
        GREEDY: tiny_cards["tiny-a"].model_copy(
            update={"key": GREEDY, "display_name": "Greedy twin", "sampling_defaults": greedy}
        ),
        SEEING_KEY: seeing_card(load_cards()[BASE_CARD], SEEING_FOLDER),
        SECOND_KEY: second_card(load_cards()[SECOND_BASE_CARD], SECOND_FOLDER),
        **load_cards(),
    }
    factory = RecordingFactory(settings)
    manager = EngineManager(cards, settings, factory)
    decoder = VideoDecoderPool(workers=1)
    data = tmp_path_factory.mktemp("history")
    history = History(sqlite_url(data), data / "media")
    playground = Playground(manager, settings, decoder, history)
    demo = launch(build(playground), settings, block=False)
    yield playground, f"http://127.0.0.1:{settings.port}/", factory
    playground.close()
    demo.close()
    decoder.close()


def page_opener(
    browser: Browser, served: tuple[Playground, str, RecordingFactory]
) -> Iterator[Callable[[], Page]]:
    """Opens the app in a new browser session (its own cookies, its own conversation)."""
    contexts = []

    def open_new() -> Page:
        context = browser.new_context(viewport={"width": 1400, "height": 1000}, accept_downloads=True)
        contexts.append(context)
        page = context.new_page()
        page.set_default_timeout(120_000)
        if throttle := float(os.environ.get("BROWSER_CPU_THROTTLE", "0")):
            # A slower browser, to bring out the page's races (docs/TESTING.md).
            context.new_cdp_session(page).send("Emulation.setCPUThrottlingRate", {"rate": throttle})
        page.goto(served[1])
        page.wait_for_selector("#chat-input textarea")
        return page

    yield open_new
    for context in contexts:
        context.close()


# --- helpers ---------------------------------------------------------------------------------


# A file's Remove button in a message box: one for each file the box holds.
REMOVE_FILE = "button[aria-label='Remove file']"


def attach(page: Page, box: str, files: list[Path]) -> None:
    """Attaches `files` one after another, as a visitor picking them one at a time, each once it
    is in the box and uploaded. (Gradio's box holds a message sent during an upload until the
    upload ends: `test_enter_while_a_picture_uploads_...`.) Picked together, two files passed
    that wait and the message went with one of them, the other left in the box for the next
    (twice in about ten clean-clone runs: a first turn with one picture, a follow-up with three).
    Playwright sets the input's files without the click that empties it first, so attaching the
    file the input already holds adds nothing: a test attaches a file once per page."""
    held = page.locator(f"#{box} {REMOVE_FILE}").count()
    for count, file in enumerate(files, start=held + 1):
        page.set_input_files(f"#{box} input[type=file]", [str(file)])
        page.wait_for_function(
            f'document.querySelectorAll("#{box} {REMOVE_FILE}").length >= {count}'
            f" && !document.querySelector('#{box} [aria-label=\"Uploading\"]')"
        )


def send(page: Page, text: str, files: list[Path] = (), box: str = "chat-input") -> None:
    """Types and sends a message once the box takes one (its Send button is back, with the last
    update of the handler before): while an event is pending Gradio drops a submit (trigger_mode
    "once"), and a test sending as the arena's heads said "done", updates earlier, waited for an
    answer to a message never sent."""
    poll(lambda: page.locator(f"#{box} button.submit-button").is_visible(), 60)
    if files:
        attach(page, box, list(files))
    page.fill(f"#{box} textarea", text)
    page.press(f"#{box} textarea", "Enter")


# A chat's answers, without the line under each that opens to the prompt.
ANSWERS = "[data-testid=bot]:not(:has(.thought-group))"


def bot_messages(page: Page) -> list[str]:
    """The answers (without the line under each that opens to the prompt)."""
    return page.locator(f"#chat {ANSWERS}").all_inner_texts()


def answer_labels(page: Page) -> list[str]:
    """The line under each answer: its model and speed; it opens to the exact prompt."""
    return page.locator("#chat .thought-group .title").all_inner_texts()


def user_messages(page: Page) -> int:
    return page.locator("#chat [data-testid=user]").count()


def wait_for_answer(page: Page, answers: int = 1, timeout_s: float = 120) -> str:
    """The `answers`-th answer, once the engine reported its end. Sending shows the estimate
    alone in the prompt-size line; the engine's own count joins it when the answer ends."""
    poll(
        lambda: len(bot_messages(page)) == answers and "engine counted" in page.inner_text("#prompt-size"),
        timeout_s,
        shown=lambda: page_state(page),
    )
    return bot_messages(page)[-1]


def page_state(page: Page) -> str:
    """What the chat shows, for a failed wait's message."""
    return repr(
        {
            "answers": [answer[:120] for answer in bot_messages(page)],
            "messages": user_messages(page),
            "box": page.locator("#chat-input textarea").input_value(),
            "files in the box": page.locator(f"#chat-input {REMOVE_FILE}").count(),
            "notice": page.inner_text("#notice"),
            "size line": page.inner_text("#prompt-size"),
            "send button": page.locator("#chat-input button.submit-button").is_visible(),
        }
    )


def wait_until_answering(page: Page, answers: int, timeout_s: float) -> None:
    """Until the `answers`-th answer has words in it (past the waiting text), mid-stream."""
    poll(
        lambda: (
            len(shown := bot_messages(page)) == answers
            and len(shown[-1]) > 20
            and not shown[-1].startswith(WAITING)
        ),
        timeout_s,
        shown=lambda: page_state(page),
    )


def warning(page: Page, notice: str = "notice") -> str:
    """The refusal shown above the input box (empty while there is none)."""
    text = page.inner_text(f"#{notice}")
    return text if "⚠️" in text else ""


def set_max_tokens(page: Page, prefix: str, tokens: int) -> None:
    field = page.locator(f"#{prefix}-max-tokens input[type=number]")
    slider = page.locator(f"#{prefix}-max-tokens input[type=range]")
    if not field.is_visible():
        page.click(f"#{prefix}-sampling button")
        # Typed into before the opened accordion's slider showed its value, the box once held
        # 16 while the answer went at the model's 512 (a clean clone, 2026-12-06): type into it
        # once both parts show one value.
        poll(
            lambda: field.is_visible() and field.input_value() == slider.input_value() != "",
            10,
            shown=lambda: f"box {field.input_value()!r}, slider {slider.input_value()!r}",
        )
    held = range(
        int(slider.get_attribute("min") or 0),
        int(slider.get_attribute("max") or 0) + 1,
        int(slider.get_attribute("step") or 1),
    )
    # Gradio clamps a value the slider cannot hold when the box loses focus: tests that typed 8
    # or 4 (below its 16) ran at some other count without saying so.
    assert tokens in held, (
        f"{prefix}'s slider holds {held.start}-{held.stop - 1} by {held.step}: not {tokens}"
    )
    # A value is sent only once the slider itself holds it: on a busy machine the number box's
    # Enter was once lost while the accordion opened, so type again.
    for _ in range(5):
        field.fill(str(tokens))
        field.press("Enter")
        try:
            poll(lambda: slider.input_value() == str(tokens), 3)
            # Leaves the box, as a visitor moving on to the message does: Gradio takes a typed
            # number for good when its box loses focus (it clamps it then).
            field.press("Tab")
            return
        except AssertionError:
            continue
    raise AssertionError(f"the {prefix} max-tokens slider never took {tokens}")


def open_sidebar(page: Page) -> None:
    """Opens the history sidebar (Gradio's own toggle) unless it is open: a closed one is slid
    off the page's left edge, still "visible" to Playwright."""

    def shown() -> bool:
        box = page.locator("#history-new").bounding_box()
        return box is not None and box["x"] >= 0

    if not shown():
        page.click("#history .toggle-button")
    poll(shown, 10)


def pick(page: Page, dropdown: str, label_part: str) -> None:
    page.click(f"#{dropdown} input")
    page.get_by_role("option").filter(has_text=label_part).first.click()


def compare_the_twins(page: Page, max_tokens: int) -> list[str]:
    """Opens the compare tab, takes out the two models it comes with (their labels are returned:
    on a CPU box the trained seeing models) and picks the two random-weight twins instead, each
    to answer at most `max_tokens` tokens."""
    page.get_by_role("tab", name="Compare").click()
    picked = page.locator("#compare-models .token")
    poll(lambda: picked.count() == 2)
    came_with = picked.all_inner_texts()
    page.click("#compare-models .remove-all")
    poll(lambda: picked.count() == 0)
    pick(page, "compare-models", LABEL_A)
    pick(page, "compare-models", LABEL_B)
    set_max_tokens(page, "compare", max_tokens)
    return came_with


def shoot(page: Page, name: str) -> None:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / name), full_page=True)


def poll(
    condition: Callable[[], Any],
    timeout_s: float = 30,
    every_s: float = 0.1,
    shown: Callable[[], str] | None = None,
) -> Any:
    """`condition`'s value once true; where it never is, the failure says what was `shown` then
    (a wait that failed on CI only, once, said nothing more than its time)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if value := condition():
            return value
        time.sleep(every_s)
    raise AssertionError(
        f"not true within {timeout_s} s" + (f"; shown: {shown_or_why(shown)}" if shown else "")
    )


def shown_or_why(shown: Callable[[], str]) -> str:
    """What a failed wait shows, or why it could not be read (the wait's own failure stays)."""
    try:
        return shown()
    except Exception as error:
        return f"(not read: {type(error).__name__}: {str(error)[:200]})"
