"""The app end to end: the real Gradio server, the real vLLM engine on the demo twins, and
Debian's Chromium driven by Playwright. Screenshots of the main views go to test-artifacts/screenshots/
(`make screenshots`: to docs/screenshots/, the README's).

One server and one browser serve the whole module; each test opens its own page (its own
session). The twins answer nonsense, so the tests check what the app does around them.
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import pytest
from gradio.utils import get_upload_folder
from PIL import Image
from playwright.sync_api import Browser, Page
from ports import free_port

from app.catalog.cards import ModelCard, load_cards
from app.config import Settings
from app.demo.models import SEEING_FOLDER
from app.demo.seeing_model import SEEING_KEY, seeing_card
from app.demo.shapes import Drawn, picture
from app.engines.base import SamplingSettings, card_sampling
from app.engines.manager import EngineManager
from app.engines.vllm_engine import VllmEngineFactory
from app.media.loading import VideoDecoderPool
from app.storage.history import History, sqlite_url
from app.views import Playground, build, launch
from app.views.chat import WAITING

pytestmark = [pytest.mark.slow, pytest.mark.vllm]

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

    async def build(self, card: Any, report: Callable[[str], None], devices: tuple[int, ...] = (0,)) -> Any:
        engine = await super().build(card, report, devices)
        generate = engine.generate

        def to_max_tokens(card: Any, messages: Any, sampling: SamplingSettings, request_id: str) -> Any:
            self.asked.append(messages)
            if card.key != SEEING_KEY:  # the trained model's answers end where it ends them
                sampling = replace(sampling, ignore_eos=True)
            return generate(card, messages, sampling, request_id)

        engine.generate = to_max_tokens
        self.engines[card.key] = engine
        return engine


@pytest.fixture(scope="module")
def served(
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
        SEEING_KEY: seeing_card(load_cards()["qwen2_vl"], SEEING_FOLDER),
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


@pytest.fixture
def open_page(
    browser: Browser, served: tuple[Playground, str, RecordingFactory]
) -> Iterator[Callable[[], Page]]:
    """Opens the app in a new browser session (its own cookies, its own conversation)."""
    contexts = []

    def open_new() -> Page:
        context = browser.new_context(viewport={"width": 1400, "height": 1000}, accept_downloads=True)
        contexts.append(context)
        page = context.new_page()
        page.set_default_timeout(120_000)
        page.goto(served[1])
        page.wait_for_selector("#chat-input textarea")
        return page

    yield open_new
    for context in contexts:
        context.close()


@pytest.fixture
def page(open_page: Callable[[], Page]) -> Page:
    return open_page()


# --- helpers ---------------------------------------------------------------------------------


def attach(page: Page, box: str, files: list[Path]) -> None:
    page.set_input_files(f"#{box} input[type=file]", [str(f) for f in files])
    page.wait_for_function(
        f"document.querySelectorAll('#{box} button[aria-label=\"Remove file\"]').length >= {len(files)}"
    )


def send(page: Page, text: str, files: list[Path] = (), box: str = "chat-input") -> None:
    if files:
        attach(page, box, list(files))
    page.fill(f"#{box} textarea", text)
    page.press(f"#{box} textarea", "Enter")


def bot_messages(page: Page) -> list[str]:
    """The answers (without the line under each that opens to the prompt)."""
    return page.locator("#chat [data-testid=bot]:not(:has(.thought-group))").all_inner_texts()


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
    )
    return bot_messages(page)[-1]


def wait_until_answering(page: Page, answers: int, timeout_s: float) -> None:
    """Until the `answers`-th answer has words in it (past the waiting text), mid-stream."""
    poll(
        lambda: (
            len(shown := bot_messages(page)) == answers
            and len(shown[-1]) > 20
            and not shown[-1].startswith(WAITING)
        ),
        timeout_s,
    )


def warning(page: Page, notice: str = "notice") -> str:
    """The refusal shown above the input box (empty while there is none)."""
    text = page.inner_text(f"#{notice}")
    return text if "⚠️" in text else ""


def set_max_tokens(page: Page, prefix: str, tokens: int) -> None:
    field = page.locator(f"#{prefix}-max-tokens input[type=number]")
    if not field.is_visible():
        page.click(f"#{prefix}-sampling button")
    slider = page.locator(f"#{prefix}-max-tokens input[type=range]")
    bounds = range(int(slider.get_attribute("min") or 0), int(slider.get_attribute("max") or 0) + 1)
    # A value in the slider's range is sent only once the slider itself holds it: on a busy
    # machine the number box's Enter was once lost while the accordion opened, so type again.
    for _ in range(5):
        field.fill(str(tokens))
        field.press("Enter")
        if tokens not in bounds:
            return
        try:
            poll(lambda: slider.input_value() == str(tokens), 3)
            return
        except AssertionError:
            continue
    raise AssertionError(f"the {prefix} max-tokens slider never took {tokens}")


def pick(page: Page, dropdown: str, label_part: str) -> None:
    page.click(f"#{dropdown} input")
    page.get_by_role("option").filter(has_text=label_part).first.click()


def shoot(page: Page, name: str) -> None:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / name), full_page=True)


def poll(condition: Callable[[], Any], timeout_s: float = 30, every_s: float = 0.1) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if value := condition():
            return value
        time.sleep(every_s)
    raise AssertionError(f"not true within {timeout_s} s")


# --- the chat view ---------------------------------------------------------------------------


def test_an_image_question_gets_a_streamed_answer(page: Page):
    send(page, "What shapes do you see?", [EXAMPLES / "shapes.png"])
    seen: list[int] = []
    while "engine counted" not in page.inner_text("#prompt-size"):
        answers = bot_messages(page)
        if answers and not answers[-1].startswith(WAITING):
            seen.append(len(answers[-1]))
        time.sleep(0.05)
    final = wait_for_answer(page)
    partial = {length for length in seen if 0 < length < len(final)}
    assert len(partial) >= 2, f"the answer arrived in one piece, not streamed: {seen[:20]}"
    assert page.locator("#chat [data-testid=user] img").count() == 1
    assert re.search(
        r"Prompt: about \d+ of 4,096 tokens .*the engine counted \d+", page.inner_text("#prompt-size")
    )
    assert "ready" in page.inner_text("#model-state")
    shoot(page, "chat.png")


def test_a_video_turn_shows_the_sampled_frames_with_their_times(page: Page):
    send(page, "How does the ball move?", [EXAMPLES / "bouncing_ball.mp4"])
    captions = page.locator("#chat .caption-label")
    poll(lambda: captions.count() == 16)
    times = [float(text.removesuffix(" s")) for text in captions.all_inner_texts()]
    assert times[0] == 0.0 and times == sorted(times) and times[-1] > 3.0
    # Every frame is inside the chat's width, none cut off past its edge (6 of 16 were).
    chat = page.locator("#chat").bounding_box()
    strip = page.locator("#chat [data-testid=user]").filter(has=page.locator(".caption-label")).last
    frames = [image.bounding_box() for image in strip.locator("img").all()]
    assert len(frames) == 16 and chat is not None
    left, right = chat["x"], chat["x"] + chat["width"]
    assert all(f and left <= f["x"] and f["x"] + f["width"] <= right for f in frames), (chat, frames)
    wait_for_answer(page)
    assert page.locator("#chat video").count() == 1
    shoot(page, "chat-video.png")


def test_stop_ends_the_answer_in_the_engine_and_the_chat_goes_on(
    page: Page, served: tuple[Playground, str, RecordingFactory]
):
    playground = served[0]
    set_max_tokens(page, "chat", 4096)
    send(page, "Tell me a long story.")
    wait_until_answering(page, answers=1, timeout_s=120)
    # While it streams, the box's Send button is a Stop button, and Escape presses it.
    stop = page.locator("#chat-input button.stop-button")
    assert stop.is_visible() and not page.locator("#chat-input button.submit-button").is_visible()
    page.keyboard.press("Escape")
    poll(lambda: answer_labels(page) and answer_labels(page)[-1].endswith("stopped"))
    poll(lambda: playground.manager.unfinished_requests(TINY_A) == 0, 10)
    stopped = bot_messages(page)[-1]
    time.sleep(1)
    assert bot_messages(page)[-1] == stopped
    poll(lambda: page.locator("#chat-input button.submit-button").is_visible(), 10)
    set_max_tokens(page, "chat", 32)
    send(page, "Go on.")
    wait_for_answer(page, answers=2)
    assert len(bot_messages(page)) == 2 and not answer_labels(page)[-1].endswith("stopped")


def test_each_answer_is_labelled_with_its_model_and_opens_to_the_exact_prompt(page: Page):
    """Answers were not labelled: after a model switch mid-conversation they looked the same."""
    set_max_tokens(page, "chat", 16)
    send(page, "What shapes do you see?", [EXAMPLES / "shapes.png"])
    wait_for_answer(page)
    counted = re.search(r"the engine counted (\d+)", page.inner_text("#prompt-size"))
    label = r" · first token \d+\.\d\d s · 16 tokens · \d+\.\d tok/s · cut at the token limit"
    assert re.fullmatch(re.escape(LABEL_A) + label, answer_labels(page)[0]), answer_labels(page)
    page.locator("#chat .thought-group .title").first.click()
    opened = poll(
        lambda: "Media" in (text := page.locator("#chat .thought-group").first.inner_text()) and text
    )
    assert counted and f"Prompt ({counted[1]} tokens, as the engine counted them)" in opened
    assert "<|vision_start|><|image_pad|><|vision_end|>What shapes do you see?<|im_end|>" in opened
    width, height = Image.open(EXAMPLES / "shapes.png").size
    assert "shapes.png: image, " in opened and f"{width}×{height} px" in opened
    assert "max tokens 16" in opened and "seed random" in opened
    pick(page, "model", LABEL_B)
    send(page, "And what do you see?")
    wait_for_answer(page, answers=2, timeout_s=180)
    assert [label.split(" · ")[0] for label in answer_labels(page)] == [LABEL_A, LABEL_B]


def test_a_second_enter_while_an_answer_streams_is_sent_when_it_ends(
    page: Page, served: tuple[Playground, str, RecordingFactory]
):
    """It was dropped without a word."""
    factory = served[2]
    set_max_tokens(page, "chat", 128)
    send(page, "A first question")
    wait_until_answering(page, answers=1, timeout_s=120)
    send(page, "Typed while the first answer streams")
    wait_for_answer(page, answers=2, timeout_s=180)
    assert user_messages(page) == 2
    first, second = (json.dumps(messages, default=str) for messages in factory.asked[-2:])
    assert "Typed while" not in first and "Typed while the first answer streams" in second
    assert not answer_labels(page)[0].endswith("stopped")


def test_a_reload_keeps_the_conversation_and_the_model(
    page: Page, served: tuple[Playground, str, RecordingFactory]
):
    factory = served[2]
    pick(page, "model", LABEL_B)
    set_max_tokens(page, "chat", 16)
    send(page, "Remember the lighthouse", [EXAMPLES / "shapes.png"])
    answer = wait_for_answer(page, timeout_s=180)
    page.reload()
    page.wait_for_selector("#chat-input textarea")
    poll(lambda: bot_messages(page) == [answer], 30)
    assert page.locator("#chat [data-testid=user] img").count() == 1
    assert LABEL_B in page.input_value("#model input")
    send(page, "And then?")
    wait_for_answer(page, answers=2, timeout_s=180)
    assert "lighthouse" in json.dumps(factory.asked[-1], default=str)


def test_a_closed_tab_leaves_no_files_behind(
    open_page: Callable[[], Page], served: tuple[Playground, str, RecordingFactory]
):
    """Gradio ends the session when the tab closes; its folder (the tab's own copies of what it
    sent) is deleted after the reload grace period (20 s here), not left for hours. The uploads
    are Gradio's, shared by identical uploads of other tabs, and its own sweep takes them."""
    sessions = served[0].sessions
    page = open_page()
    set_max_tokens(page, "chat", 16)
    send(page, "What is this?", [EXAMPLES / "shapes.png"])
    wait_for_answer(page)
    token = page.evaluate("sessionStorage.getItem('vlm-playground-session')")
    chat = sessions.visits[token].chat
    folder = chat.folder
    assert folder.exists() and list(folder.iterdir())
    page.context.close()
    poll(lambda: not folder.exists(), 120)
    assert token not in sessions.visits and (EXAMPLES / "shapes.png").is_file()


def test_the_seeing_demo_model_answers_about_the_picture_sent_in_the_page_and_the_api(
    page: Page, served: tuple[Playground, str, RecordingFactory], tmp_path: Path
):
    """The pixels a user sends through the page (and the API) are the pixels the model sees."""
    from gradio_client import Client, handle_file

    pictures = {}
    for colour, side in (("red", "left"), ("blue", "right")):
        pictures[colour] = tmp_path / f"{colour}.png"
        picture(random.Random(3), [Drawn(colour, "square", side)], (240, 180)).save(pictures[colour])
    pick(page, "model", "Shapes and colours")
    # Its examples come first: a picture of a blue triangle on the right.
    page.get_by_text("What shape is it?", exact=True).first.click()
    poll(lambda: page.locator("#chat-input textarea").input_value() == "What shape is it?")
    page.press("#chat-input textarea", "Enter")
    assert wait_for_answer(page, timeout_s=180).strip() == "triangle"
    page.click("#clear")
    poll(lambda: user_messages(page) == 0)
    send(page, "What colour is the shape?", [pictures["red"]])
    assert wait_for_answer(page, timeout_s=180).strip() == "red"
    send(page, "Which side of the picture is the shape on?", [pictures["blue"]])
    assert wait_for_answer(page, answers=2, timeout_s=60).strip() == "right"
    client = Client(served[1], verbose=False)
    message = {"text": "What colour is the shape?", "files": [handle_file(str(pictures["blue"]))]}
    assert client.predict(message, SEEING_KEY, "", 0.0, 1.0, 16, None, api_name="/chat").strip() == "blue"


def test_two_pictures_then_a_third_in_a_follow_up_all_reach_the_model(
    page: Page, served: tuple[Playground, str, RecordingFactory]
):
    """The core promise: several pictures in a message, and a follow-up picture, in one chat."""
    factory = served[2]
    set_max_tokens(page, "chat", 8)
    send(page, "Compare these two.", [EXAMPLES / "shapes.png", EXAMPLES / "bar_chart.png"])
    wait_for_answer(page)
    send(page, "And this one?", [EXAMPLES / "green_square.png"])
    wait_for_answer(page, answers=2)
    assert "Clear" not in page.inner_text("#notice") and "new chat" not in page.inner_text("#notice")
    parts = [p for m in factory.asked[-1] for p in m["content"] if isinstance(p, dict)]
    assert [p["type"] for p in parts].count("image") == 3
    # Past the model's four a prompt: the oldest is left out, and the chat says which.
    send(page, "Two more.", [EXAMPLES / "one_shape.png", EXAMPLES / "three_shapes.png"])
    wait_for_answer(page, answers=3)
    assert "no longer sees shapes.png" in page.inner_text("#notice")
    parts = [p for m in factory.asked[-1] for p in m["content"] if isinstance(p, dict)]
    assert [p["type"] for p in parts].count("image") == 4
    assert any("an earlier picture was here" in p.get("text", "") for p in parts)


def test_the_chats_own_trash_icon_clears_the_conversation_the_model_gets(
    page: Page, served: tuple[Playground, str, RecordingFactory]
):
    factory = served[2]
    set_max_tokens(page, "chat", 8)
    send(page, "An old question about a lighthouse")
    wait_for_answer(page)
    page.locator("#chat button[aria-label='Clear']").click()
    poll(lambda: user_messages(page) == 0 and not bot_messages(page))
    send(page, "A new question")
    wait_for_answer(page)
    assert user_messages(page) == 1
    assert "lighthouse" not in json.dumps(factory.asked[-1], default=str)


def test_undo_regenerate_and_clear(page: Page):
    set_max_tokens(page, "chat", 16)
    send(page, "First question")
    wait_for_answer(page)
    send(page, "Second question")
    wait_for_answer(page, answers=2)
    assert user_messages(page) == 2
    page.click("#undo")
    poll(lambda: user_messages(page) == 1)
    assert page.input_value("#chat-input textarea") == "Second question"
    first_answer = bot_messages(page)[0]
    # The twin's random weights answer alike whatever the seed; a longer limit shows that
    # the answer was made again, with the settings of now.
    set_max_tokens(page, "chat", 64)
    page.click("#regenerate")
    poll(lambda: (answers := bot_messages(page)) and len(answers[0]) > len(first_answer))
    wait_for_answer(page)
    assert user_messages(page) == 1 and len(bot_messages(page)) == 1
    page.click("#clear")
    poll(lambda: user_messages(page) == 0 and not bot_messages(page))


def test_switching_models_shows_the_load_progress_in_the_chat(page: Page):
    pick(page, "model", LABEL_B)
    page.click("#model-card-box button")
    poll(lambda: LABEL_B in page.inner_text("#model-card"))
    card = page.inner_text("#model-card")
    # Named by the repository it copies: its folder on the server (`tiny-twins` here) was shown.
    assert "a random-weight twin of llava-hf/llava-1.5-7b-hf" in card and "tiny-twins" not in card
    assert "random weights" in card
    send(page, "Hello, second model.")
    progress = poll(lambda: next((a for a in bot_messages(page) if a.startswith(WAITING)), None), 60)
    assert re.search(r"is (queued|loading|unloading)", progress)
    shoot(page, "loading.png")
    wait_for_answer(page, timeout_s=180)
    assert not bot_messages(page)[-1].startswith(WAITING)
    poll(lambda: "ready" in page.inner_text("#model-state"), 10)


def test_models_this_machine_cannot_serve_are_listed_with_the_reason_not_offered(page: Page):
    """60 entries said "(unavailable)" with no reason, could be picked, and were refused on send."""
    page.click("#model input")
    offered = page.get_by_role("option").all_inner_texts()
    assert any(LABEL_A in option for option in offered)
    assert not any("Qwen2.5-VL 3B" in option for option in offered)
    page.keyboard.press("Escape")
    reason = "Qwen2.5-VL 3B Instruct: needs an NVIDIA GPU; this machine has none"
    for _ in range(3):  # a click that only closed the dropdown list opens nothing: click again
        page.click("#unavailable button")
        try:
            poll(lambda: reason in page.inner_text("#unavailable"), 5)
            break
        except AssertionError:
            continue
    assert reason in page.inner_text("#unavailable")


def test_on_a_phone_the_model_picker_and_the_message_box_are_near_the_top(
    browser: Browser, served: tuple[Playground, str, RecordingFactory]
):
    """At 390x844 the picker and settings sat 1,500 px down, below buttons and examples."""
    context = browser.new_context(viewport={"width": 390, "height": 844}, is_mobile=True, has_touch=True)
    try:
        page = context.new_page()
        page.goto(served[1])
        page.wait_for_selector("#chat-input textarea")
        picker = page.locator("#model").bounding_box()
        assert picker and picker["y"] + picker["height"] <= 844, picker
        chat, box = page.locator("#chat").bounding_box(), page.locator("#chat-input").bounding_box()
        assert chat and box and picker["y"] < chat["y"] < box["y"] < 2 * 844, (chat, box)
        # The sidebar's toggle does not cover the title, and a long model name stops short of
        # the picker's arrow ("...") instead of running under it.
        toggle, title = page.locator("#history .toggle-button").bounding_box(), page.locator("#title h1")
        assert toggle and toggle["x"] + toggle["width"] <= title.evaluate(
            "h => h.getBoundingClientRect().left + parseFloat(getComputedStyle(h).paddingLeft)"
        )
        name = page.locator("#model input")
        assert name.evaluate("e => getComputedStyle(e).textOverflow") == "ellipsis"
        # Headings in the visitor's own interface font: Gradio's cut-down copy of Source Sans Pro
        # drew "Model A" as "Model ᴀ".
        assert page.evaluate("getComputedStyle(document.querySelector('h1')).fontFamily").startswith(
            "system-ui"
        )
        shoot(page, "phone.png")
    finally:
        context.close()


def test_picking_a_model_sets_the_sampling_to_its_cards_defaults(page: Page):
    """A card asking for greedy decoding and 8192 tokens (as DeepSeek-OCR's does); the demo
    models ask for nothing."""
    page.click("#chat-sampling button")
    temperature = page.locator("#chat-temperature input[type=number]")
    max_tokens = page.locator("#chat-max-tokens input[type=number]")
    pick(page, "model", "Greedy twin")
    poll(lambda: max_tokens.input_value() == "8192", 10)
    assert float(temperature.input_value()) == 0.0
    pick(page, "model", LABEL_B)
    poll(lambda: max_tokens.input_value() == "512", 10)
    assert float(temperature.input_value()) == 0.7


def test_a_broken_file_or_an_oversized_prompt_keeps_the_history_and_others_stream(
    open_page: Callable[[], Page], tmp_path: Path
):
    page, other = open_page(), open_page()
    set_max_tokens(page, "chat", 16)
    send(page, "A first question")
    wait_for_answer(page)
    history = (user_messages(page), bot_messages(page))
    set_max_tokens(other, "chat", 256)
    send(other, "Meanwhile, another user asks something.")
    broken = tmp_path / "holiday.png"
    broken.write_bytes(b"\x89PNG\r\n\x1a\n but the rest is not a picture")
    send(page, "What is in this photo?", [broken])
    notice = poll(lambda: warning(page))
    assert "image" in notice.lower() and str(tmp_path) not in notice and "Traceback" not in notice
    assert (user_messages(page), bot_messages(page)) == history
    assert page.input_value("#chat-input textarea") == "What is in this photo?"
    page.click("#chat-input button[aria-label='Remove file']")
    send(page, "word " * 20000)
    poll(lambda: "tokens" in warning(page))
    # The refusal is in sight, above the grown input box (it was below the window's edge).
    seen, window = page.locator("#notice").bounding_box(), page.viewport_size
    assert seen and window and seen["y"] >= 0 and seen["y"] + seen["height"] <= window["height"], seen
    assert (user_messages(page), bot_messages(page)) == history
    wait_for_answer(other)
    assert len(bot_messages(other)) == 1 and not bot_messages(other)[0].startswith(WAITING)
    # Each session sees only its own conversation.
    assert user_messages(other) == 1 and "another user" not in page.inner_text("#chat")
    shoot(page, "refused.png")


def test_an_engine_failure_mid_answer_keeps_the_conversation_and_the_model_comes_back(
    page: Page, served: tuple[Playground, str, RecordingFactory]
):
    factory = served[2]
    set_max_tokens(page, "chat", 16)
    send(page, "A first question")
    wait_for_answer(page, timeout_s=180)
    history = (user_messages(page), bot_messages(page))
    set_max_tokens(page, "chat", 4096)
    send(page, "Tell me everything.")
    wait_until_answering(page, answers=2, timeout_s=60)
    os.kill(factory.engines[TINY_A].process_ids[0], signal.SIGKILL)
    notice = poll(lambda: warning(page), 30)
    assert "Traceback" not in notice and "/" not in notice.replace("n/a", "")
    poll(lambda: (user_messages(page), bot_messages(page)) == history, 10)
    assert page.input_value("#chat-input textarea") == "Tell me everything."
    poll(lambda: "stopped unexpectedly" in page.inner_text("#model-state"), 10)
    set_max_tokens(page, "chat", 16)
    page.press("#chat-input textarea", "Enter")
    wait_for_answer(page, answers=2, timeout_s=180)
    assert user_messages(page) == 2


# --- the compare view ------------------------------------------------------------------------


def test_two_models_compared_side_by_side_and_exported(
    page: Page, served: tuple[Playground, str, RecordingFactory]
):
    page.get_by_role("tab", name="Compare").click()
    pick(page, "compare-models", LABEL_A)
    pick(page, "compare-models", LABEL_B)
    set_max_tokens(page, "compare", 32)
    send(page, "Which shape is on the left?", [EXAMPLES / "shapes.png"], box="compare-input")
    heads = [page.locator(f"#compare-head-{i}") for i in (0, 1)]
    waiting = poll(lambda: any("waiting for" in head.inner_text() for head in heads), 60)
    assert waiting  # the two tiny models do not fit together here (max_resident=1): they take turns
    poll(lambda: all("tok/s" in head.inner_text() for head in heads), 240)
    # What every model was sent is above the columns; each answer can be copied.
    sent = page.inner_text("#compare-sent")
    assert "Which shape is on the left?" in sent and "shapes.png: image" in sent
    assert page.locator("#compare-answer-0 button[aria-label*='Copy' i]").count() == 1
    # The message box's Send button is back (it was Stop while the answers streamed).
    poll(lambda: page.locator("#compare-input button.submit-button").is_visible(), 10)
    shoot(page, "compare.png")
    with page.expect_download() as download:
        page.click("#export-json")
    exported = json.loads(Path(download.value.path()).read_text(encoding="utf-8"))
    columns = exported["columns"]
    assert [c["key"] for c in columns] == [TINY_A, TINY_B]
    assert all(
        c["state"] == "done" and c["answer"] and c["ttft_s"] > 0 and c["tokens_per_s"] > 0 for c in columns
    )
    # Each column's prompt is in its own model's format.
    assert "<|vision_start|><|image_pad|><|vision_end|>" in columns[0]["prompt"]
    assert columns[1]["prompt"].startswith("USER: <image>\n")
    assert exported["sampling"]["max_tokens"] == 32 and exported["files"] == ["shapes.png"]
    # Each model answers with its own temperature and top-p, as in the chat (the seeing model's 0).
    assert exported["sampling"]["temperature"] is None
    for column in columns:
        own, used = card_sampling(served[0].choices[column["key"]].card), column["sampling"]
        assert (used["temperature"], used["top_p"]) == (own.temperature, own.top_p)
    with page.expect_download() as download:
        page.click("#export-md")
    markdown = Path(download.value.path()).read_text(encoding="utf-8")
    assert markdown.count("\n## ") == 2 and "Time to first token" in markdown
    # Stored as it ended, listed in the history, and reopened into the compare tab.
    history = served[0].history
    assert history is not None
    stored = poll(lambda: [s for s in history.list(browser_id(page)) if s.kind == "compare"])
    assert stored[0].title == "Which shape is on the left?" and stored[0].model == f"{TINY_A},{TINY_B}"
    answers = [page.inner_text(f"#compare-answer-{i}") for i in (0, 1)]
    page.get_by_role("tab", name="Chat").click()
    open_sidebar(page)
    page.locator("#history-list label").filter(has_text="Compare: Which shape").click()
    poll(lambda: page.locator("#compare-answer-0").is_visible())
    assert [page.inner_text(f"#compare-answer-{i}") for i in (0, 1)] == answers
    assert "Which shape is on the left?" in page.inner_text("#compare-sent")


# --- the API and the public-page defaults ----------------------------------------------------


def test_the_chat_api_streams_through_gradio_client(
    served: tuple[Playground, str, RecordingFactory], capfd: pytest.CaptureFixture[str]
):
    from gradio_client import Client, handle_file
    from gradio_client.exceptions import AppError

    client = Client(served[1], verbose=False)
    endpoints = client.view_api(return_format="dict", print_info=False)["named_endpoints"]
    assert set(endpoints) == {"/chat", "/leaderboard"}
    # Its help names the parameters in the page's order (they were param_3...), and its example works.
    parameters = endpoints["/chat"]["parameters"]
    names = [parameter["parameter_name"] for parameter in parameters]
    assert names == ["message", "model", "system_prompt", "temperature", "top_p", "max_tokens", "seed"]
    example = [parameter["example_input"] for parameter in parameters]
    assert example[1] == TINY_A
    assert client.predict(*example[:5], 8, None, api_name="/chat")
    capfd.readouterr()
    message = {"text": "Describe the picture.", "files": [handle_file(str(EXAMPLES / "bar_chart.png"))]}
    job = client.submit(message, TINY_A, "", 0.0, 1.0, 24, 7, api_name="/chat")
    updates = list(job)
    assert len(updates) >= 2 and updates[-1] and all(updates[-1].startswith(u) for u in updates)
    with pytest.raises(AppError, match="cannot be served here"):
        client.predict({"text": "hi", "files": []}, "qwen2_5_vl", "", 0.7, 1.0, 16, None, api_name="/chat")
    with pytest.raises(AppError, match="Pick a model"):
        client.predict({"text": "hi", "files": []}, "/etc/passwd", "", 0.7, 1.0, 16, None, api_name="/chat")
    # The API takes what the page's controls take (it accepted up to 2**63 tokens before).
    with pytest.raises(AppError, match="Max tokens is 100,000; this page allows at most 4,096"):
        client.predict({"text": "hi", "files": []}, TINY_A, "", 0.7, 1.0, 100_000, None, api_name="/chat")
    with pytest.raises(AppError, match="Temperature is -1"):
        client.predict({"text": "hi", "files": []}, TINY_A, "", -1, 1.0, 16, None, api_name="/chat")
    # A user's refusal is not a server error: no traceback in the log (48 of 58 logged lines were).
    assert "Traceback" not in "".join(capfd.readouterr())


def test_the_surface_is_the_page_and_chat_only_and_says_no_server_path(
    served: tuple[Playground, str, RecordingFactory], tmp_path: Path
):
    url = served[1]
    photo = tmp_path / "photo.png"
    Image.new("RGB", (8, 8), "red").save(photo)
    with httpx.Client(base_url=url, timeout=30) as http:
        # The page's own events are not an API (they ran through /call/<name> with the history).
        for name in ("send", "regenerate", "undo", "resume", "load_example", "chat_api"):
            assert http.post(f"gradio_api/call/{name}", json={"data": []}).status_code == 404, name
        assert http.post("gradio_api/call/chat", json={"data": []}).status_code == 200
        # Uploads come from this page (or a script), never from another site's page.
        with photo.open("rb") as handle:
            foreign = http.post(
                "gradio_api/upload",
                files={"files": ("photo.png", handle, "image/png")},
                headers={"Origin": "https://elsewhere.example"},
            )
        assert foreign.status_code == 403
        with photo.open("rb") as handle:
            upload = http.post(
                "gradio_api/upload",
                files={"files": ("photo.png", handle, "image/png")},
                headers={"Origin": url.rstrip("/")},
            )
        assert upload.status_code == 200
        (stored,) = upload.json()
        # No server path in the answer: the upload folder is a name on the wire, and it works.
        assert (
            stored.startswith("@uploads/")
            and stored.endswith("/photo.png")
            and get_upload_folder() not in upload.text
        )
        assert http.get(f"gradio_api/file={stored}").content == photo.read_bytes()
        refused = http.get("gradio_api/file=/etc/passwd")
        assert refused.status_code in (403, 404) and "/etc" not in refused.text
        # The examples are served from where they lie, under a name: no server path in the page.
        config = http.get("config").text
        assert str(ROOT) not in config and "@examples/" in config
        # The page's address is never taken from a request's headers.
        config = http.get("config", headers={"X-Forwarded-Host": "evil.example"})
        assert config.status_code == 200 and "evil.example" not in config.text
        assert http.get("config", headers={"Host": "evil.example"}).status_code == 421


def test_public_page_defaults(served: tuple[Playground, str, RecordingFactory], tmp_path: Path):
    url = served[1]
    with httpx.Client(base_url=url, timeout=30) as http:
        assert http.get("monitoring").status_code in (403, 404)
        big = tmp_path / "big.png"
        big.write_bytes(b"\0" * (UPLOAD_LIMIT + 1024))
        with big.open("rb") as handle:
            upload = http.post("gradio_api/upload", files={"files": ("big.png", handle, "image/png")})
        assert upload.status_code == 413
        # The REST route that would skip the queue is closed.
        direct = http.post("gradio_api/run/chat", json={"data": [{"text": "hi", "files": []}, TINY_A]})
        assert direct.status_code != 200 or "error" in direct.text.lower()
        # The page's example clicks go through it by index; a script's other guesses do not.
        for call in ({"fn_index": 0, "data": [999]}, {"fn_index": 9999, "data": []}, {"data": [0]}):
            assert http.post("gradio_api/run/predict", json=call).status_code == 404, call


def test_the_ui_module_imports_no_torch():
    code = "import sys, app.views; print(sorted(m for m in ('torch', 'vllm') if m in sys.modules))"
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


# --- the history sidebar ---------------------------------------------------------------------


def history_items(page: Page) -> list[str]:
    return page.locator("#history-list label").all_inner_texts()


def open_sidebar(page: Page) -> None:
    """Opens the history sidebar (Gradio's own toggle) unless it is open: a closed one is slid
    off the page's left edge, still "visible" to Playwright."""

    def shown() -> bool:
        box = page.locator("#history-new").bounding_box()
        return box is not None and box["x"] >= 0

    if not shown():
        page.click("#history .toggle-button")
    poll(shown, 10)


def browser_id(page: Page) -> str:
    """The tab's browser id, once the page's script has set it (it runs after the page loads)."""
    return poll(lambda: page.evaluate("localStorage.getItem('vlm-playground-browser')"), 10)


def test_the_history_sidebar_keeps_reopens_exports_and_deletes_conversations(
    open_page: Callable[[], Page], served: tuple[Playground, str, RecordingFactory]
):
    history = served[0].history
    assert history is not None
    page = open_page()
    set_max_tokens(page, "chat", 16)
    send(page, "The first conversation's question")
    first_answer = wait_for_answer(page)
    open_sidebar(page)
    poll(lambda: len(history_items(page)) == 1)
    assert history_items(page)[0].startswith(f"The first conversation's question · {LABEL_A} · 1 turn · ")
    page.click("#history-new")
    poll(lambda: user_messages(page) == 0)
    send(page, "The second one")
    wait_for_answer(page)
    poll(lambda: len(history_items(page)) == 2)
    assert history_items(page)[0].startswith("The second one")  # the latest first

    # A reload keeps the open conversation; the list is still there.
    page.reload()
    page.wait_for_selector("#chat-input textarea")
    poll(lambda: user_messages(page) == 1)
    assert "The second one" in page.inner_text("#chat")
    open_sidebar(page)
    poll(lambda: len(history_items(page)) == 2)

    # Reopened: the first conversation, its answer and the line under it, and it goes on.
    page.locator("#history-list label").filter(has_text="The first conversation").click()
    poll(lambda: "The first conversation's question" in page.inner_text("#chat"))
    assert bot_messages(page) == [first_answer]
    assert answer_labels(page)[0].startswith("Qwen2-VL")
    send(page, "And a follow-up")
    wait_for_answer(page, answers=2)
    poll(lambda: any("2 turns" in item for item in history_items(page)))
    stored = {s.title: s for s in history.list(browser_id(page))}
    assert stored["The first conversation's question"].turns == 2

    # Exported as JSON (importing is tested in tests/test_history.py); another browser sees none of it.
    with page.expect_download() as download:
        page.click("#history-export")
        page.click("#history-download")
    exported = Path(download.value.path()).read_text(encoding="utf-8")
    assert json.loads(exported)["conversation"]["turns"][1]["text"] == "And a follow-up"
    other = open_page()
    open_sidebar(other)
    assert history_items(other) == [] and browser_id(other) != browser_id(page)

    # Deleted: gone from the list, from the database, and from the chat that had it open.
    page.locator("#history-list label").filter(has_text="The first conversation").click()
    page.click("#history-delete")  # the first click asks
    poll(lambda: "again" in page.locator("#history-notice").inner_text())
    assert len(history_items(page)) == 2
    page.click("#history-delete")
    poll(lambda: len(history_items(page)) == 1)
    poll(lambda: user_messages(page) == 0)
    assert [s.title for s in history.list(browser_id(page))] == ["The second one"]
    shoot(page, "history.png")


def expire(history: Any, digest: str) -> None:
    """The history's retention passing for one file (the others, other tests', stay)."""
    from app.storage.history import MediaRow

    with history.session() as session:
        row = session.get(MediaRow, digest)
        history.media_path(row.hash, row.suffix).unlink()
        row.stored_at = None


def test_a_reopened_chat_whose_picture_expired_shows_its_thumbnail_and_keeps_it_after_a_follow_up(
    page: Page, served: tuple[Playground, str, RecordingFactory]
):
    playground, _, factory = served
    history = playground.history
    assert history is not None
    set_max_tokens(page, "chat", 8)
    send(page, "An old picture's question", [EXAMPLES / "shapes.png"])
    wait_for_answer(page)
    open_sidebar(page)
    poll(lambda: any("An old picture's question" in item for item in history_items(page)))
    (stored,) = [s for s in history.list(browser_id(page)) if s.title == "An old picture's question"]
    (medium,) = history.load(browser_id(page), stored.id).turns[0].media
    expire(history, medium.hash)

    gone = page.locator("#chat [data-testid=user]").filter(has_text="shapes.png: no longer kept")
    for round_ in range(2):  # reopened, goes on, and reopened again after the follow-up
        page.click("#history-new")
        poll(lambda: user_messages(page) == 0)
        page.locator("#history-list label").filter(has_text="An old picture's question").click()
        poll(lambda: gone.count() == 1)
        assert "no longer kept on the server, so the model does not see it" in gone.inner_text()
        assert gone.locator("img").count() == 1  # the stored thumbnail
        assert "no longer kept on the server" in page.inner_text("#history-notice")
        if round_ == 0:
            asked = len(factory.asked)
            send(page, "And now?")
            wait_for_answer(page, answers=2)
            parts = [p for m in factory.asked[asked] for p in m["content"] if isinstance(p, dict)]
            assert not [p for p in parts if p.get("type") in ("image", "video")]  # not sent
    turns = history.load(browser_id(page), stored.id).turns
    assert [t.text for t in turns] == ["An old picture's question", "And now?"]
    assert [m.hash for m in turns[0].media] == [medium.hash]
    assert history.thumbnail(browser_id(page), medium.hash)


def test_a_reopened_video_chat_shows_the_frames_the_model_sees_again(page: Page):
    set_max_tokens(page, "chat", 8)
    send(page, "A clip to come back to", [EXAMPLES / "bouncing_ball.mp4"])
    captions = page.locator("#chat .caption-label")
    poll(lambda: captions.count() == 16)
    sent = captions.all_inner_texts()
    wait_for_answer(page)
    open_sidebar(page)
    poll(lambda: any("A clip to come back to" in item for item in history_items(page)))
    page.click("#history-new")
    poll(lambda: user_messages(page) == 0)
    page.locator("#history-list label").filter(has_text="A clip to come back to").click()
    poll(lambda: captions.count() == 16, 60)
    assert captions.all_inner_texts() == sent  # the same frames at the same times


# --- the arena and its leaderboard -------------------------------------------------------------


def arena_answers(page: Page, side: str) -> list[str]:
    return page.locator(f"#arena-{side} [data-testid=bot]").all_inner_texts()


def test_a_blind_battle_of_two_turns_takes_a_vote_names_the_models_and_updates_the_leaderboard(
    page: Page, served: tuple[Playground, str, RecordingFactory]
):
    from gradio_client import Client

    history = served[0].history
    assert history is not None
    names = [TINY_A, TINY_B, "Qwen2-VL", "LLaVA"]
    heads = [page.locator("#arena-head-a"), page.locator("#arena-head-b")]
    page.get_by_role("tab", name="Arena").click()
    send(page, "Which shape is on the left?", [EXAMPLES / "shapes.png"], box="arena-input")
    # The two twins do not fit together here (max_resident=1): one side waits, unnamed.
    poll(lambda: any("waiting for its turn" in head.inner_text() for head in heads), 60)
    poll(lambda: all("done" in head.inner_text() for head in heads), 240)
    send(page, "And on the right?", box="arena-input")
    poll(lambda: all(len(arena_answers(page, side)) == 2 for side in "ab"), 240)
    poll(lambda: all("done" in head.inner_text() for head in heads), 240)
    seen = " ".join(
        [page.inner_text("#arena-a"), page.inner_text("#arena-b"), *(h.inner_text() for h in heads)]
    )
    assert not any(name in seen for name in names)
    assert not page.inner_text("#arena-reveal").strip()
    shoot(page, "arena.png")

    page.fill("#arena-reason textarea", "It named the shape")
    page.click("#arena-vote-b")
    # (While the vote is stored, the line shows Gradio's timer: wait for the names.)
    revealed = poll(
        lambda: "Model A was" in page.inner_text("#arena-reveal") and page.inner_text("#arena-reveal"), 30
    )
    (vote,) = poll(lambda: history.votes(), 10)
    labels = {TINY_A: LABEL_A, TINY_B: LABEL_B}
    assert vote.outcome == "b" and {vote.model_a, vote.model_b} == {TINY_A, TINY_B}
    assert f"Model A was {labels[vote.model_a]}; Model B was {labels[vote.model_b]}" in revealed
    assert labels[vote.model_b] in heads[1].inner_text() and not page.locator("#arena-vote-a").is_visible()
    assert history.votes("image") == [vote]

    # The leaderboard counts the vote (the winner first), by modality too, and exports it.
    page.get_by_role("tab", name="Leaderboard").click()
    poll(lambda: page.inner_text("#leaderboard-summary").startswith("1 vote (all votes)"), 30)
    table = page.inner_text("#leaderboard-table")
    assert table.index(labels[vote.model_b]) < table.index(labels[vote.model_a])
    with page.expect_download() as download:
        page.click("#leaderboard-csv")
    rows = Path(download.value.path()).read_text(encoding="utf-8").splitlines()
    assert rows[0].startswith("rank,model,name,score") and rows[1].split(",")[1] == vote.model_b
    page.locator("#leaderboard-modality label").filter(has_text="Video").click()
    poll(lambda: page.inner_text("#leaderboard-summary").startswith("No votes yet (video)"), 30)
    # And through the API.
    board = Client(served[1], verbose=False).predict("image", api_name="/leaderboard")
    assert board["votes"] == 1 and [row["model"] for row in board["rows"]] == [vote.model_b, vote.model_a]

    # A side's own trash icon ends the battle: both sides empty, the next message starts anew.
    page.get_by_role("tab", name="Arena").click()
    page.locator("#arena-a button[aria-label='Clear']").click()
    poll(lambda: not arena_answers(page, "a") and not arena_answers(page, "b"))
    assert not page.inner_text("#arena-reveal").strip()
    send(page, "A new battle's question", box="arena-input")
    poll(lambda: all(len(arena_answers(page, side)) == 1 for side in "ab"), 240)


# --- prompt sets in a grid -----------------------------------------------------------------------


def grid_done(page: Page) -> int:
    """Answers done, from the progress bar."""
    value = (
        page.get_attribute("#grid-progress progress", "value")
        if page.locator("#grid-progress progress").count()
        else None
    )
    return int(value or 0)


def test_a_prompt_set_runs_across_two_models_into_a_grid_stops_resumes_exports_and_reopens(
    page: Page, served: tuple[Playground, str, RecordingFactory]
):
    history = served[0].history
    assert history is not None
    page.get_by_role("tab", name="Grid").click()
    pick(page, "grid-builtin", "shapes-and-colours")
    pick(page, "grid-models", "Shapes and colours")
    pick(page, "grid-models", LABEL_B)
    page.click("#grid-check")
    report = poll(
        lambda: "items on" in page.inner_text("#grid-notice") and page.inner_text("#grid-notice"), 60
    )
    # Six items, one refused up front for the LLaVA twin (it takes no clip), said so.
    assert "6 items on 2 models; 11 of 12 answers can run." in report
    assert "item 6 (clip-end): LLaVA 1.5 7B: random-weight twin does not take videos" in report
    assert page.locator("#grid-table tbody tr").count() == 6  # the rows, before any answer

    # Run, stop part-way, and resume: the answers kept are not asked again.
    stop = page.locator("#grid-stop")
    assert stop.is_disabled()  # nothing to stop yet: a red Stop on an idle grid looked live
    page.click("#grid-run")
    poll(lambda: grid_done(page) >= 2, 240)
    assert stop.is_enabled()
    page.click("#grid-stop")
    stopped = poll(
        lambda: "Stopped with" in page.inner_text("#grid-notice") and page.inner_text("#grid-notice"), 120
    )
    kept = int(stopped.split("Stopped with ")[1].split()[0])
    assert 2 <= kept < 12, stopped
    poll(stop.is_disabled, 10)
    page.click("#grid-run")
    poll(lambda: "11 of 12 answers, 1 refused or failed" in page.inner_text("#grid-progress"), 300)
    table = page.inner_text("#grid-table")
    # The seeing model's answers are right (the pixels reached it), each with its speed.
    for answer in ("triangle", "right", "three", "green", "red"):
        assert answer in table
    assert table.count("first token") == 11 and table.count("matches") == 6
    shoot(page, "grid.png")

    # The HTML report stands alone: thumbnails inline.
    with page.expect_download() as download:
        page.click("#grid-html")
    report_html = Path(download.value.path()).read_text(encoding="utf-8")
    assert report_html.count("data:image/jpeg;base64,") == 7 and report_html.count("matches") == 6

    # Stored in the history, and reopened there into the grid tab.
    (stored,) = [s for s in history.list(browser_id(page)) if s.kind == "grid"]
    assert stored.title == "Grid: shapes-and-colours" and stored.turns == 6
    page.reload()
    page.wait_for_selector("#chat-input textarea")
    open_sidebar(page)
    page.locator("#history-list label").filter(has_text="Grid: shapes-and-colours").click()
    poll(
        lambda: (
            "Reopened shapes-and-colours: 11 of 12 answers, 1 refused" in page.inner_text("#history-notice")
        ),
        60,
    )
    poll(lambda: "triangle" in page.inner_text("#grid-table"), 30)


# --- document answers --------------------------------------------------------------------------

DOCUMENT_ANSWER = (
    "| item | price |\n| --- | --- |\n| tea | 3 |\n| cake | 4 |\n\n"
    "Inline \\(E = mc^2\\) and on its own line:\n\n$$\\int_0^1 x\\,dx = \\frac{1}{2}$$\n\n"
    "```python\nprint('total', 3 + 4)\n```\n"
)


def test_an_ocr_answer_renders_its_table_latex_and_code_and_copies_as_written(
    page: Page, served: tuple[Playground, str, RecordingFactory]
):
    from app.storage.history import ConversationRecord, ReplyRecord, TurnRecord, new_id

    history = served[0].history
    assert history is not None
    page.context.grant_permissions(["clipboard-read", "clipboard-write"])
    reply = ReplyRecord(model=TINY_A, display_name=LABEL_A, answer=DOCUMENT_ANSWER)
    record = ConversationRecord(
        id=new_id(), title="A receipt", model=TINY_A, turns=[TurnRecord(text="Read it", replies=[reply])]
    )
    history.save(browser_id(page), record)
    page.reload()
    page.wait_for_selector("#chat-input textarea")
    open_sidebar(page)
    page.locator("#history-list label").filter(has_text="A receipt").click()
    poll(lambda: page.locator("#chat [data-testid=bot] table").count() == 1, 30)
    answer = page.locator("#chat [data-testid=bot]").first
    assert answer.locator("table tbody tr").count() == 2
    # Inline and display LaTeX typeset by KaTeX; the code as a code block.
    assert answer.locator(".katex").count() >= 2 and answer.locator(".katex-display").count() == 1
    assert "print('total', 3 + 4)" in answer.locator("pre code").inner_text()
    assert "\\frac" not in answer.inner_text()
    # The answer's copy button (the question has one too) gives it as the model wrote it: the
    # Markdown and LaTeX source, not the rendered text (then the line under it, in the same bubble).
    answer.hover()
    page.locator("#chat button[aria-label='Copy message']").last.click()
    copied = poll(lambda: page.evaluate("navigator.clipboard.readText()"), 10)
    assert copied.startswith(DOCUMENT_ANSWER.strip()), copied
