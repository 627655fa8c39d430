"""The chat view end to end: the real Gradio server, the real vLLM engine on the demo twins and
the seeing model, and Debian's Chromium driven by Playwright (the bench: `ui_pages.py`)."""

from __future__ import annotations

import json
import os
import random
import re
import signal
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from PIL import Image
from playwright.sync_api import Browser, Page, Route
from ui_pages import (
    ANSWERS,
    EXAMPLES,
    LABEL_A,
    LABEL_B,
    REMOVE_FILE,
    TINY_A,
    RecordingFactory,
    answer_labels,
    attach,
    bot_messages,
    open_sidebar,
    page_state,
    pick,
    poll,
    send,
    set_max_tokens,
    shoot,
    user_messages,
    wait_for_answer,
    wait_until_answering,
    warning,
)

from app.demo.seeing_model import SEEING_KEY
from app.demo.shapes import Drawn, picture
from app.engines.tokens import context_length, register_context
from app.views import Playground
from app.views.chat import WAITING

pytestmark = [pytest.mark.slow, pytest.mark.vllm]

# --- the chat view ---------------------------------------------------------------------------


# Records, in the page, the length of the last answer at each change of the chat: every state
# the browser drew, where polling from the test saw one state in two clean-clone runs (the whole
# answer of 512 tokens drawn between two polls, 64 tokens in another run).
RECORD_ANSWER_LENGTHS = """([answersSelector, waiting]) => {
    window.answerLengths = [];
    const chat = document.querySelector('#chat');
    new MutationObserver(() => {
        const answers = chat.querySelectorAll(answersSelector);
        const text = answers.length ? answers[answers.length - 1].innerText : '';
        if (text && !text.startsWith(waiting)) window.answerLengths.push(text.length);
    }).observe(chat, {subtree: true, childList: true, characterData: true});
}"""


def test_an_image_question_gets_a_streamed_answer(page: Page):
    # The twin runs every answer to its max tokens: the page's default took 77 s on a slow
    # 2-core machine alone and past the 120 s wait beside a training run; 128 still streams.
    set_max_tokens(page, "chat", 128)
    page.evaluate(RECORD_ANSWER_LENGTHS, [ANSWERS, WAITING])
    send(page, "What shapes do you see?", [EXAMPLES / "shapes.png"])
    final = wait_for_answer(page)
    seen: list[int] = page.evaluate("window.answerLengths")
    partial = {length for length in seen if 0 < length < len(final)}
    assert len(partial) >= 2, f"the answer was drawn in one piece, not streamed: {sorted(set(seen))[:20]}"
    assert page.locator("#chat [data-testid=user] img").count() == 1
    assert re.search(
        r"Prompt: about \d+ of 4,096 tokens .*the engine counted \d+", page.inner_text("#prompt-size")
    )
    # The state panel has its own update (on a busy machine still queued when the answer ends,
    # so it said "loading" for a moment on a clean clone): it must come to "ready".
    state = page.locator("#model-state")
    poll(lambda: "ready" in state.inner_text(), shown=state.inner_text)
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
    playground, factory = served[0], served[2]
    set_max_tokens(page, "chat", 4096)
    stop = page.locator("#chat-input button.stop-button")
    submit = page.locator("#chat-input button.submit-button")

    def stop_shown() -> bool:
        return stop.is_visible() and not submit.is_visible()

    # The answer pauses after some pieces, so it is still streaming whatever this machine's speed
    # (its 4,096 tokens ended before Stop in one run of four with a training beside it). Enough
    # pieces for the 20 characters `wait_until_answering` waits for: the twin's 8 random tokens
    # once came to 20 exactly, and CI waited for the 21st until its timeout.
    factory.pause_after(64)
    try:
        send(page, "Tell me a long story.")
        wait_until_answering(page, answers=1, timeout_s=120)
        # While it streams, the box's Send button is a Stop button, and Escape presses it (a page
        # on a busy machine may turn it a moment after the answer's first words).
        poll(stop_shown, 10, shown=lambda: page_state(page))
        # An example clicked meanwhile fills the box and leaves the Stop button (it brought Send back).
        page.get_by_text("Which bar is the tallest?", exact=True).first.click()
        poll(lambda: page.locator("#chat-input textarea").input_value() != "")
        assert stop_shown(), "an example clicked mid-answer brought Send back"
        page.keyboard.press("Escape")
        poll(lambda: len(answer_labels(page)) == 1)
        assert answer_labels(page)[-1].endswith("stopped")
        # The page closed the answer's stream before its end (closing it aborts the request in
        # vLLM: tests/test_engine.py), rather than the answer ending on its own.
        poll(lambda: factory.streaming[TINY_A] == 0, 10)
        assert factory.endings[-1] == "closed"
    finally:
        factory.release()
    poll(lambda: playground.manager.unfinished_requests(TINY_A) == 0, 10)
    stopped = bot_messages(page)[-1]
    time.sleep(1)
    assert bot_messages(page)[-1] == stopped
    poll(lambda: submit.is_visible(), 10)
    set_max_tokens(page, "chat", 32)
    send(page, "Go on.")
    wait_for_answer(page, answers=2)
    assert len(bot_messages(page)) == 2 and not answer_labels(page)[-1].endswith("stopped")
    assert factory.endings[-1] == "ended"


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


def test_a_message_can_be_sent_only_once_the_page_has_its_session(
    browser: Browser, served: tuple[Playground, str, RecordingFactory]
):
    """On a busy server the tab's session (the page's load event) comes after the page shows. A
    message sent before it was refused, "This page lost its session; reload it" (on CI a test's
    first message was never answered). The box takes a message once the session is there."""
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    # The page's events held back, its load (the session) among them, as a busy server would.
    held: list[Route] = []
    holding = [True]

    def hold(route: Route) -> None:
        if holding[0]:
            held.append(route)
        else:
            route.continue_()

    context.route("**/gradio_api/queue/join*", hold)
    try:
        page = context.new_page()
        page.set_default_timeout(120_000)
        page.goto(served[1])
        page.wait_for_selector("#chat-input textarea")

        def some_held() -> bool:
            # Playwright calls a route's handler only inside one of its own calls: a poll that
            # only sleeps never sees a request that came after the page showed (it failed on CI).
            page.wait_for_timeout(100)
            return bool(held)

        poll(some_held, 30)
        page.wait_for_timeout(500)  # the page's other first events, if any, held too
        assert not page.is_editable("#chat-input textarea")
        page.get_by_role("tab", name="Grid").click()  # its Check button sends too
        assert not page.is_enabled("#grid-check")
        holding[0] = False
        for route in held:
            route.continue_()
        poll(lambda: page.is_enabled("#grid-check"), 30)
        page.get_by_role("tab", name="Chat").click()
        poll(lambda: page.is_editable("#chat-input textarea"), 30)
        set_max_tokens(page, "chat", 16)
        send(page, "Are you there?")
        wait_for_answer(page)
        assert warning(page) == ""
    finally:
        context.close()


def test_a_page_whose_session_could_not_start_says_to_reload_it(
    browser: Browser, served: tuple[Playground, str, RecordingFactory]
):
    """The server refused the page's load (its queue full): the boxes stay closed, and the page
    says, for good, to reload (Gradio's own toast says "try again" and fades; nothing retries)."""
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    refused: list[str] = []

    def refuse_the_first(route: Route) -> None:
        if refused:
            route.continue_()
        else:
            refused.append(route.request.url)
            route.fulfill(status=503, content_type="application/json", body='{"detail": "Queue is full."}')

    context.route("**/gradio_api/queue/join*", refuse_the_first)
    try:
        page = context.new_page()
        page.goto(served[1])
        poll(lambda: "reload it" in page.inner_text("#notice"), 30)
        assert not page.is_editable("#chat-input textarea")
    finally:
        context.close()


def test_a_closed_tab_leaves_no_files_behind(
    open_page: Callable[[], Page],
    served: tuple[Playground, str, RecordingFactory],
    monkeypatch: pytest.MonkeyPatch,
):
    """Gradio ends the session when the tab closes; its folder (the tab's own copies of what it
    sent) is deleted after the reload grace period (2 s for this test, 20 s for the module's
    reloads), not left for hours. The uploads are Gradio's, shared by identical uploads of other
    tabs, and its own sweep takes them."""
    sessions = served[0].sessions
    monkeypatch.setattr(sessions, "grace_s", 2.0)
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
    # Only the questions it answers are offered (a chart question got "three"), the first a
    # picture of a blue triangle on the right.
    poll(lambda: not any_visible(page, "Which bar is the tallest?"))
    page.get_by_text("What shape is it?", exact=True).first.click()
    poll(lambda: page.locator("#chat-input textarea").input_value() == "What shape is it?")
    page.press("#chat-input textarea", "Enter")
    assert wait_for_answer(page, timeout_s=180).strip() == "triangle"
    # It points: asked where a shape is, it answers with a box, which the chat draws on the picture.
    page.click("#clear")
    poll(lambda: user_messages(page) == 0)
    page.get_by_text("Where is the red circle?", exact=True).first.click()
    poll(lambda: page.locator("#chat-input textarea").input_value() == "Where is the red circle?")
    page.press("#chat-input textarea", "Enter")
    # The drawn picture follows the answer as a message of its own.
    poll(lambda: any('"label": "red circle"' in shown for shown in bot_messages(page)), 180)
    poll(lambda: page.get_by_text("The 1 box this answer names", exact=False).count() > 0, 60)
    # The picture sent and the one with the box drawn on it.
    poll(lambda: page.locator("#chat img").count() >= 2 and page.locator("#chat img").last.is_visible(), 30)
    # One shape named among the three (lesson three): offered to this model, and answered.
    page.click("#clear")
    poll(lambda: user_messages(page) == 0)
    page.get_by_text("What colour is the square?", exact=True).first.click()
    poll(lambda: page.locator("#chat-input textarea").input_value() == "What colour is the square?")
    page.press("#chat-input textarea", "Enter")
    assert wait_for_answer(page, timeout_s=60).strip() == "yellow"
    page.click("#clear")
    poll(lambda: user_messages(page) == 0)
    send(page, "What colour is the shape?", [pictures["red"]])
    assert wait_for_answer(page, timeout_s=180).strip() == "red"
    send(page, "Which side of the picture is the shape on?", [pictures["blue"]])
    assert wait_for_answer(page, answers=2, timeout_s=60).strip() == "right"
    client = Client(served[1], verbose=False)
    message = {"text": "What colour is the shape?", "files": [handle_file(str(pictures["blue"]))]}
    assert client.predict(message, SEEING_KEY, "", 0.0, 1.0, 16, None, api_name="/chat").strip() == "blue"
    # Another model: the general examples, not the seeing model's.
    pick(page, "model", LABEL_B)
    poll(
        lambda: any_visible(page, "Which bar is the tallest?") and not any_visible(page, "What shape is it?")
    )


def test_the_second_seeing_model_is_offered_only_the_questions_it_answers(page: Page):
    """The examples follow the model picked in the page (issue 29, item 7): the second seeing model
    (a tiny LLaVA) writes no boxes and was not taught descriptions, counts of a colour or a shape
    named among several, so its shelf leaves them out; the question it is offered, it answers."""
    pick(page, "model", "Shapes too, smaller")
    not_offered = ("Describe the picture.", "Where is the red circle?", "How many red shapes are there?")
    poll(
        lambda: (
            any_visible(page, "What colour is the shape?")
            and not any(any_visible(page, text) for text in not_offered)
        ),
        shown=lambda: f"offered: {[text for text in not_offered if any_visible(page, text)]}",
    )
    page.get_by_text("What colour is the shape?", exact=True).first.click()
    poll(lambda: page.locator("#chat-input textarea").input_value() == "What colour is the shape?")
    page.press("#chat-input textarea", "Enter")
    assert wait_for_answer(page, timeout_s=180).strip() == "blue"  # the page's blue triangle
    assert answer_labels(page)[0].split(" · ")[0] == "Shapes too, smaller: tiny LLaVA trained here"
    # Back to the first: its whole shelf again.
    pick(page, "model", "Shapes and colours")
    poll(lambda: all(any_visible(page, text) for text in not_offered))


def any_visible(page: Page, text: str) -> bool:
    found = page.get_by_text(text, exact=True)
    return any(found.nth(i).is_visible() for i in range(found.count()))


def test_two_pictures_then_a_third_in_a_follow_up_all_reach_the_model(
    page: Page, served: tuple[Playground, str, RecordingFactory]
):
    """The core promise: several pictures in a message, and a follow-up picture, in one chat."""
    factory = served[2]
    set_max_tokens(page, "chat", 16)
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


def test_enter_while_a_picture_uploads_sends_it_with_the_message_once_uploaded(
    page: Page, served: tuple[Playground, str, RecordingFactory]
):
    """A visitor on a slow line presses Enter before the picture has reached the server: the
    message waits for it and goes with it (Gradio's box does this; a Gradio upgrade that sent at
    once would send the question without its picture)."""
    factory = served[2]
    set_max_tokens(page, "chat", 16)
    poll(lambda: page.locator("#chat-input button.submit-button").is_visible(), 60)
    held: list[Route] = []  # the upload, held as a slow line holds it
    page.route("**/gradio_api/upload*", lambda route: held.append(route))
    page.set_input_files("#chat-input input[type=file]", [str(EXAMPLES / "green_square.png")])
    poll(lambda: page.wait_for_timeout(100) or held, 30)  # (the wait lets Playwright route it)
    page.fill("#chat-input textarea", "What colour is this?")
    page.press("#chat-input textarea", "Enter")
    page.wait_for_timeout(1000)
    asked = len(factory.asked)
    assert user_messages(page) == 0  # nothing went without the picture
    for route in held:
        route.continue_()
    page.unroute("**/gradio_api/upload*")
    wait_for_answer(page)
    assert len(factory.asked) == asked + 1
    [message] = factory.asked[-1]
    assert [part["type"] for part in message["content"]] == ["image", "text"]
    assert message["content"][-1]["text"] == "What colour is this?"


def test_the_chats_own_trash_icon_clears_the_conversation_the_model_gets(
    page: Page, served: tuple[Playground, str, RecordingFactory]
):
    factory = served[2]
    set_max_tokens(page, "chat", 16)
    send(page, "An old question about a lighthouse")
    wait_for_answer(page)
    page.locator("#chat button[aria-label='Clear']").click()
    poll(lambda: user_messages(page) == 0 and not bot_messages(page))
    send(page, "A new question")
    wait_for_answer(page)
    assert user_messages(page) == 1
    assert "lighthouse" not in json.dumps(factory.asked[-1], default=str)


def test_clear_leaves_what_the_user_typed_meanwhile_in_the_box(page: Page):
    """On a busy server the reply to Clear came after the user typed the next message, and
    emptied the box: Enter then sent nothing (a CI run: "Write a message or add a file first")."""
    set_max_tokens(page, "chat", 16)
    send(page, "An old question")
    wait_for_answer(page)
    poll(lambda: page.locator("#edit-menu").is_visible())
    held: list[Route] = []  # Clear's request held while the user types, as a busy server does
    page.route("**/gradio_api/queue/join*", lambda route: held.append(route))
    page.click("#clear")
    poll(lambda: page.wait_for_timeout(100) or held, 30)  # (the wait lets Playwright route it)
    page.fill("#chat-input textarea", "The next question")
    for route in held:
        route.continue_()
    page.unroute("**/gradio_api/queue/join*")
    # The Edit menu hides once the chat's controls show the cleared chat: Clear's reply has come.
    poll(lambda: not page.locator("#edit-menu").is_visible())
    assert user_messages(page) == 0
    assert page.input_value("#chat-input textarea") == "The next question"


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
    # The page's first model answers first: one model is resident at a time, so the second has
    # to load whichever test ran before (after one that used it, it was there, and showed no load).
    set_max_tokens(page, "chat", 16)
    send(page, "Hello, first model.")
    wait_for_answer(page)
    pick(page, "model", LABEL_B)
    page.click("#model-card-box button")
    poll(lambda: LABEL_B in page.inner_text("#model-card"))
    card = page.inner_text("#model-card")
    # Named by the repository it copies: its folder on the server (`tiny-twins` here) was shown.
    assert "a random-weight twin of llava-hf/llava-1.5-7b-hf" in card and "tiny-twins" not in card
    assert "random weights" in card
    send(page, "Hello, second model.")
    # The answer says "waiting" until the model's first status reaches it, then what the model does.
    shown = re.compile(rf"^{WAITING}: .* is (queued|loading|unloading)")
    poll(lambda: any(shown.search(answer) for answer in bot_messages(page)), 60)
    shoot(page, "loading.png")
    wait_for_answer(page, answers=2, timeout_s=180)
    assert not bot_messages(page)[-1].startswith(WAITING)
    poll(lambda: "ready" in page.inner_text("#model-state"), 10)


def test_the_default_models_panel_shows_the_context_its_engine_was_built_with(
    open_page: Callable[[], Page], served: tuple[Playground, str, RecordingFactory]
):
    """The panel of the model a page opens with is written when the page loads, not when the app
    starts: a chat-sized context registered since (a GPU build) shows without picking it again."""
    playground, _, _ = served
    key = playground.default_model
    assert key is not None
    card = playground.choices[key].card
    before = context_length(card)
    register_context(key, 12_288)
    try:
        page = open_page()
        page.click("#model-card-box button")
        poll(lambda: "Context: 12288 tokens" in page.inner_text("#model-card"))
    finally:
        register_context(key, before)


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
    # Its panel says what it takes, and no clip settings for a model that takes no clips (the
    # LLaVA card said "text and images", then "video frames sampled: 16").
    page.click("#model-card-box button")
    poll(lambda: "LLaVA" in page.inner_text("#model-card"), 10)
    assert "text, image" in page.inner_text("#model-card") and "video" not in page.inner_text("#model-card")
    pick(page, "model", LABEL_A)
    poll(lambda: "video frames sampled" in page.inner_text("#model-card"), 10)
    # The chat takes most of the window's height (it was about 360 px: most turns needed scrolling).
    box = page.locator("#chat").bounding_box()
    assert box is not None and box["height"] >= 0.6 * 1000


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
    page.click(f"#chat-input {REMOVE_FILE}")
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
    streamed = factory.streamed[TINY_A]
    send(page, "Tell me everything.")
    # Killed as soon as the engine streams, not once the page shows words: its 4,096 tokens take
    # from a few seconds to some 25, and on a busy clean clone the kill found nothing in flight
    # (most likely the answer had ended: the next test's message was the first to notice it).
    poll(lambda: factory.streamed[TINY_A] > streamed, 60)
    assert factory.streaming[TINY_A] == 1, f"the answer had ended before the kill: {factory.sampled[-1]}"
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


def test_an_earlier_message_edited_with_its_picture_branches_and_every_version_stays(
    page: Page, served: tuple[Playground, str, RecordingFactory]
):
    """Edit and branch: the first message's text and picture changed and sent again; the chat
    goes on from there, the earlier version stays a pick away, regenerate adds a version, and
    all of them are stored, survive a reload and come back when the chat is reopened."""
    playground, _, factory = served
    set_max_tokens(page, "chat", 16)
    send(page, "Describe the first picture.", [EXAMPLES / "shapes.png"])
    wait_for_answer(page)
    send(page, "And a second question.")
    wait_for_answer(page, answers=2)
    assert not page.locator("#versions").is_visible()

    # The first message picked to edit: its text and its picture go into the box.
    pick(page, "edit-menu", "1. “Describe the first picture.” (+1 file)")
    poll(lambda: page.input_value("#chat-input textarea") == "Describe the first picture.")
    assert "Editing message 1" in page.inner_text("#notice")
    assert page.locator(f"#chat-input {REMOVE_FILE}").count() == 1
    # Its text and picture changed, then sent: the chat goes on from the edited message.
    page.locator(f"#chat-input {REMOVE_FILE}").click()
    attach(page, "chat-input", [EXAMPLES / "green_square.png"])
    page.fill("#chat-input textarea", "Describe this one instead.")
    page.press("#chat-input textarea", "Enter")
    poll(lambda: user_messages(page) == 2 and "And a second question." not in page.inner_text("#chat"))
    wait_for_answer(page)
    parts = [p for m in factory.asked[-1] for p in m["content"] if isinstance(p, dict)]
    images = [p["image"] for p in parts if p["type"] == "image"]
    texts = json.dumps(factory.asked[-1], default=str)
    assert len(images) == 1 and images[0].size == Image.open(EXAMPLES / "green_square.png").size
    assert "Describe this one instead." in texts and "first picture" not in texts and "second" not in texts
    # (hidden by the refresh that follows the answer's end, as the menus are)
    poll(lambda: not page.locator("#cancel-edit").is_visible(), 10)

    # Both versions are a pick away; the first comes back whole, with what followed it.
    poll(lambda: page.locator("#versions").is_visible())
    pick(page, "versions", "Message 1, version 1 of 2")
    poll(lambda: "And a second question." in page.inner_text("#chat") and len(bot_messages(page)) == 2)
    assert "Describe the first picture." in page.inner_text("#chat")

    # Regenerate keeps the answer it replaces: a second version of the last exchange.
    first_answer = bot_messages(page)[1]
    page.click("#regenerate")
    poll(lambda: any(label.startswith("Version 2 of 2") for label in answer_labels(page)), 60)
    wait_for_answer(page, answers=2)
    pick(page, "versions", "Message 2, version 1 of 2")
    poll(lambda: bot_messages(page)[1] == first_answer)

    # Stored with every version: a reload keeps them, and so does reopening from the history.
    history = playground.history
    assert history is not None
    browser = poll(lambda: page.evaluate("localStorage.getItem('vlm-playground-browser')"), 10)
    summary = poll(lambda: history.list(browser))[0]
    # (the switch back to the first answer stored last, once its event has run)
    stored = poll(
        lambda: (
            (r := history.load(browser, summary.id)).turns[-1].versions and r.turns[-1].shown_at == 0 and r
        )
    )
    assert [v[0].text for v in stored.turns[0].versions] == ["Describe this one instead."]
    assert len(stored.turns) == 2 and stored.turns[1].text == "And a second question."
    page.reload()
    page.wait_for_selector("#chat-input textarea")
    poll(lambda: page.locator("#versions").is_visible() and user_messages(page) == 3)
    open_sidebar(page)
    page.click("#history-new")
    poll(lambda: user_messages(page) == 0 and not page.locator("#versions").is_visible())
    page.locator("#history-list label").filter(has_text="Describe the first picture.").click()
    poll(lambda: page.locator("#versions").is_visible() and user_messages(page) == 3)
    pick(page, "versions", "Message 1, version 2 of 2")
    poll(lambda: "Describe this one instead." in page.inner_text("#chat") and user_messages(page) == 2)
    shoot(page, "versions.png")
