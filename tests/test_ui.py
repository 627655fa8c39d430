"""The app end to end: the real Gradio server, the real vLLM engine on the demo twins, and
Debian's Chromium driven by Playwright. Screenshots of the main views go to test-artifacts/screenshots/
(`make screenshots`: to docs/screenshots/, the README's).

One server and one browser serve the whole module; each test opens its own page (its own
session). The twins answer nonsense, so the tests check what the app does around them.
"""

from __future__ import annotations

import json
import os
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
from playwright.sync_api import Browser, Page, sync_playwright
from ports import free_port

from app.cards import ModelCard, load_cards
from app.config import Settings
from app.engine import EngineManager, SamplingSettings
from app.media import VideoDecoderPool
from app.ui import WAITING, Playground, launch
from app.vllm_engine import VllmEngineFactory

pytestmark = [pytest.mark.slow, pytest.mark.vllm]

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "static" / "examples"
# Tests leave the tracked tree clean: screenshots go to test-artifacts/ (ignored), and into the
# README's folder only when asked (`make screenshots`).
SCREENSHOTS = ROOT / ("docs" if os.environ.get("UPDATE_SCREENSHOTS") else "test-artifacts") / "screenshots"
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
UPLOAD_LIMIT = 5 * 10**6
TINY_A, TINY_B = "demo_qwen2_vl", "demo_llava"
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
            return generate(card, messages, replace(sampling, ignore_eos=True), request_id)

        engine.generate = to_max_tokens
        self.engines[card.key] = engine
        return engine


@pytest.fixture(scope="module")
def served(tiny_cards: dict[str, ModelCard]) -> Iterator[tuple[Playground, str, RecordingFactory]]:
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
    )
    cards = {
        TINY_A: tiny_cards["tiny-a"].model_copy(update={"key": TINY_A}),
        TINY_B: tiny_cards["tiny-b"].model_copy(update={"key": TINY_B}),
        **load_cards(),
    }
    factory = RecordingFactory(settings)
    manager = EngineManager(cards, settings, factory)
    decoder = VideoDecoderPool(workers=1)
    playground = Playground(manager, settings, decoder)
    demo = launch(playground.build(), settings, block=False)
    yield playground, f"http://127.0.0.1:{settings.port}/", factory
    playground.close()
    demo.close()
    decoder.close()


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS)
        yield chromium
        chromium.close()


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
    return page.locator("#chat [data-testid=bot]").all_inner_texts()


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
    page.click("#stop")
    poll(lambda: "(stopped)" in bot_messages(page)[-1])
    poll(lambda: playground.manager.unfinished_requests(TINY_A) == 0, 10)
    stopped = bot_messages(page)[-1]
    time.sleep(1)
    assert bot_messages(page)[-1] == stopped
    set_max_tokens(page, "chat", 32)
    send(page, "Go on.")
    wait_for_answer(page, answers=2)
    assert len(bot_messages(page)) == 2 and "(stopped)" not in bot_messages(page)[-1]


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
    poll(lambda: LABEL_B in page.inner_text("#model-card"))
    assert "random weights" in page.inner_text("#model-card")
    send(page, "Hello, second model.")
    progress = poll(lambda: next((a for a in bot_messages(page) if a.startswith(WAITING)), None), 60)
    assert re.search(r"is (queued|loading|unloading)", progress)
    shoot(page, "loading.png")
    wait_for_answer(page, timeout_s=180)
    assert not bot_messages(page)[-1].startswith(WAITING)
    poll(lambda: "ready" in page.inner_text("#model-state"), 10)


def test_an_unavailable_model_says_why_and_cannot_be_used(page: Page):
    pick(page, "model", "Qwen2.5-VL 3B Instruct (unavailable)")
    poll(lambda: "Unavailable here" in page.inner_text("#model-card"))
    assert "GPU" in page.inner_text("#model-card")
    send(page, "Hello")
    notice = poll(lambda: warning(page))
    assert "cannot be served here" in notice
    assert user_messages(page) == 0
    assert page.input_value("#chat-input textarea") == "Hello"


def test_picking_a_model_sets_the_sampling_to_its_cards_defaults(page: Page):
    """DeepSeek-OCR's card asks for greedy decoding and 8192 tokens; the demo models have none."""
    page.click("#chat-sampling button")
    temperature = page.locator("#chat-temperature input[type=number]")
    max_tokens = page.locator("#chat-max-tokens input[type=number]")
    pick(page, "model", "DeepSeek-OCR (unavailable)")
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
    with page.expect_download() as download:
        page.click("#export-md")
    markdown = Path(download.value.path()).read_text(encoding="utf-8")
    assert markdown.count("\n## ") == 2 and "Time to first token" in markdown


# --- the API and the public-page defaults ----------------------------------------------------


def test_the_chat_api_streams_through_gradio_client(served: tuple[Playground, str, RecordingFactory]):
    from gradio_client import Client, handle_file
    from gradio_client.exceptions import AppError

    client = Client(served[1], verbose=False)
    assert set(client.view_api(return_format="dict", print_info=False)["named_endpoints"]) == {"/chat"}
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


def test_the_ui_module_imports_no_torch():
    code = "import sys, app.ui; print(sorted(m for m in ('torch', 'vllm') if m in sys.modules))"
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"
