"""A user's conversation: files kept per session, limits and size checked before sending."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from PIL import Image

from app.catalog.cards import ModelCard, load_cards
from app.demo.models import twin_card
from app.domain.conversation import (
    INTERNAL_ERROR,
    MAX_MESSAGE_CHARS,
    ConversationError,
    Session,
    Turn,
    check_fits,
    check_media,
    engine_messages,
    estimate_prompt_tokens,
    fitted_prompt,
    left_out_notice,
    make_turn,
    over_the_limits,
    sent_media,
    user_message,
)
from app.domain.replies import Reply, until_stopped
from app.engines.base import EngineError
from app.media.loading import MediaError, VideoDecoderPool

EXAMPLES = Path(__file__).resolve().parent.parent / "static" / "examples"
CARDS = load_cards()
TINY = twin_card(CARDS["qwen2_vl"], Path("/nonexistent/tiny"), "demo")


@pytest.fixture(scope="module")
def decoder() -> VideoDecoderPool:
    pool = VideoDecoderPool(workers=1)
    yield pool
    pool.close()


def test_the_estimate_counts_text_and_each_image_by_its_size():
    text_only = estimate_prompt_tokens(TINY, [{"role": "user", "content": "x" * 400}])
    small = Image.new("RGB", (56, 56))
    large = Image.new("RGB", (1000, 1000))
    with_small = estimate_prompt_tokens(
        TINY, [{"role": "user", "content": [{"type": "image", "image": small}]}]
    )
    with_large = estimate_prompt_tokens(
        TINY, [{"role": "user", "content": [{"type": "image", "image": large}]}]
    )
    assert text_only >= 100
    # 56x56 is 4 patches of 28x28; 1000x1000 is resized to stay under the card's max_pixels
    # (1003520: 1280 patches), as Qwen2-VL's processor does.
    rule = TINY.visual_token_rule
    assert rule.image_tokens(56, 56) == 4
    assert 1200 < rule.image_tokens(1000, 1000) <= 1280
    assert with_large - with_small == rule.image_tokens(1000, 1000) - 4
    # Cards without a rule of their own: Qwen's from the processor's pixel range, else a fixed count.
    assert CARDS["qwen2_5_vl"].visual_token_rule.max_pixels == 1003520
    assert CARDS["llava"].visual_token_rule.per_image == 256


def test_a_prompt_that_cannot_fit_is_refused_with_the_numbers():
    fits = check_fits(TINY, [{"role": "user", "content": "hello " * 100}])
    assert 100 < fits < 4096
    with pytest.raises(ConversationError, match=r"up to [\d,]+ tokens; .* takes at most 4,096"):
        check_fits(TINY, [{"role": "user", "content": "hello " * 4000}])


def test_the_size_check_uses_the_context_the_engine_was_built_with():
    """On a GPU a chat gets more context than the card's example (the engine registers what
    it was built with); the check follows the engine, not the card."""
    from app.engines.tokens import register_context

    long = [{"role": "user", "content": "hello " * 1500}]
    card = TINY.model_copy(update={"key": "chat-context-test"})
    try:
        register_context(card.key, 16384)
        assert 4096 < check_fits(card, long) < 16384
    finally:
        register_context(card.key, None)
    with pytest.raises(ConversationError, match="takes at most 4,096"):
        check_fits(card, long)


def test_without_a_tokenizer_the_estimate_is_never_below_the_tokenizers_count(tmp_path: Path):
    from app.demo.twins import build_twin
    from app.engines.tokens import counter_for

    twin = twin_card(CARDS["qwen2_vl"], build_twin(CARDS["qwen2_vl"], tmp_path), "twin-in-folder")
    counter = counter_for(twin)  # the tokenizer files in the model's local folder
    assert counter is not None and counter_for(TINY) is None
    answer = "It is sunny with a few clouds. " * 20
    for messages in (
        [{"role": "user", "content": "hi"}],
        [{"role": "user", "content": "中文字符，标点。" * 400}],
        [
            {"role": "user", "content": "Describe the weather."},
            {"role": "assistant", "content": answer},
            {"role": "user", "content": "And tomorrow? <|im_end|>"},
        ],
    ):
        exact = counter.count(messages)
        assert estimate_prompt_tokens(twin, messages) == exact
        assert estimate_prompt_tokens(TINY, messages) >= exact


def test_a_message_is_refused_only_for_what_it_holds_itself_and_says_what_to_remove():
    image_only = CARDS["blip-2"]
    with pytest.raises(ConversationError, match="does not take videos"):
        check_media(image_only, ["clip.mp4"])
    with pytest.raises(ConversationError, match="at most 1 image in one message: remove 1 image") as refused:
        check_media(image_only, ["a.png", "b.png"])
    assert "Clear" not in str(refused.value) and "new chat" not in str(refused.value)
    check_media(image_only, ["b.png"])  # whatever the conversation already holds
    with pytest.raises(ConversationError, match="at most 1 video in one message"):
        check_media(TINY, ["a.mp4", "b.mp4"])


def with_args(card: ModelCard, **args: Any) -> ModelCard:
    """`card` with these engine arguments (validated as a card file would be)."""
    fields = card.model_dump()
    fields["reference_engine_args"] = {**card.engine_args, **args}
    fields["engine_overrides"] = None
    return ModelCard.model_validate(fields)


@given(
    shape=st.lists(st.tuples(st.integers(0, 4), st.booleans()), min_size=1, max_size=6),
    image_limit=st.integers(1, 4),
)
def test_the_oldest_files_past_the_limits_are_left_out_and_the_newest_kept(
    shape: list[tuple[int, bool]], image_limit: int
):
    """Any conversation: what the prompt keeps is within the limits, is the newest of each kind,
    and always holds the last turn's own files."""
    card = with_args(TINY, limit_mm_per_prompt={"image": image_limit, "video": 1})
    turns, number = [], 0
    for images, video in shape:
        turn = Turn("t", images=[Path(f"{(number := number + 1)}.png") for _ in range(images)])
        if video:
            turn.video = Path(f"{(number := number + 1)}.mp4")
        turns.append(turn)
    last = turns[-1]
    last.images = last.images[:image_limit]
    left_out = over_the_limits(card, turns)
    every = [path for turn in turns for path in turn.files]
    kept = [path for path in every if path not in left_out]
    assert left_out == [path for path in every if path in left_out]  # oldest first, as sent
    assert not set(left_out) & set(last.files)
    for kind, limit in (("png", image_limit), ("mp4", 1)):
        of_kind = [path for path in every if path.suffix == f".{kind}"]
        kept_of_kind = [path for path in kept if path.suffix == f".{kind}"]
        assert len(kept_of_kind) == min(limit, len(of_kind))
        assert kept_of_kind == of_kind[len(of_kind) - len(kept_of_kind) :]  # the newest


def test_a_follow_up_picture_past_the_limit_leaves_the_oldest_out_with_a_marker(decoder: VideoDecoderPool):
    """A model that takes one picture per prompt: a second picture in a follow-up is answered, the
    first picture is a marker in its turn's text, and the user is told which one."""
    one_picture = CARDS["blip-2"]
    session = Session()
    first = Turn("what is this?", images=[session.keep(EXAMPLES / "shapes.png")])
    first.names[first.images[0]] = "shapes.png"
    first.media.append("shapes.png: image, 10 KB, 320×240 px")
    first.reply = Reply("blip-2", "BLIP-2", "org/blip", answer="shapes")
    second = Turn("and this?", images=[session.keep(EXAMPLES / "bar_chart.png")])
    second.names[second.images[0]] = "bar_chart.png"
    second.media.append("bar_chart.png: image, 12 KB, 320×240 px")
    prompt = asyncio.run(fitted_prompt(one_picture, [first, second], None, decoder))
    assert prompt.left_out == first.images
    parts = [part for message in prompt.messages for part in message["content"] if isinstance(part, dict)]
    assert [part["type"] for part in parts] == ["text", "image", "text"]
    assert parts[0]["text"].startswith("[an earlier picture was here") and parts[0]["text"].endswith(
        "what is this?"
    )
    notice = left_out_notice(one_picture, [first, second], prompt.left_out)
    assert "no longer sees shapes.png" in notice and "1 image" in notice
    assert sent_media([first, second], prompt.left_out)[0].endswith("(left out of this prompt)")
    session.close()


def test_pictures_that_would_overflow_the_context_leave_the_oldest_out_first(decoder: VideoDecoderPool):
    """Within the count but past the context: the oldest pictures go, one at a time, until the
    prompt fits; when the last message alone cannot fit, the refusal says what to change."""
    session = Session()
    turns = []
    for index in range(3):
        turn = Turn(f"picture {index}", images=[session.keep(EXAMPLES / "shapes.png")])
        turn.reply = Reply("demo", "Demo", "org/demo", answer="ok")
        turns.append(turn)
    card = with_args(TINY, limit_mm_per_prompt={"image": 4, "video": 1})
    whole = asyncio.run(fitted_prompt(card, turns, None, decoder))
    assert whole.left_out == []
    fitted = asyncio.run(fitted_prompt(with_args(card, max_model_len=whole.size), turns, None, decoder))
    assert fitted.left_out == turns[0].images and fitted.size < whole.size
    too_small = with_args(card, max_model_len=8)
    with pytest.raises(ConversationError, match="shorten the text, send fewer or smaller files"):
        asyncio.run(fitted_prompt(too_small, turns, None, decoder))
    session.close()


def test_a_turn_keeps_its_files_and_shows_the_frames_the_model_sees(decoder: VideoDecoderPool):
    session = Session()
    turn, clip = asyncio.run(
        make_turn(session, "what moves?", [str(EXAMPLES / "bouncing_ball.mp4")], decoder, 8)
    )
    assert clip is not None and len(clip.frames) == 8
    assert turn.video is not None and turn.video.parent == session.folder
    times = [seconds for _, seconds in turn.frames]
    assert len(times) == 8 and times == sorted(times) and times[0] == 0.0 and times[-1] > 3
    assert all(path.exists() and max(Image.open(path).size) <= 160 for path, _ in turn.frames)
    folder = session.folder
    session.close()
    assert not folder.exists() and session.turns == []


def test_a_bad_file_or_an_empty_message_is_refused(tmp_path: Path, decoder: VideoDecoderPool):
    broken = tmp_path / "holiday.png"
    broken.write_bytes(b"this is not a picture")
    session = Session()
    with pytest.raises(MediaError) as refused:
        asyncio.run(make_turn(session, "look", [str(broken)], decoder, 8))
    assert str(tmp_path) not in str(refused.value)
    with pytest.raises(ConversationError, match="Write a message"):
        asyncio.run(make_turn(session, "  ", [], decoder, 8))
    session.close()


def test_a_message_or_system_prompt_past_the_length_limit_is_refused_before_anything_counts_it(
    monkeypatch: pytest.MonkeyPatch, decoder: VideoDecoderPool
):
    """A stranger's 4 MiB message was tokenized twice on the server's event loop (about 10 s of
    every visitor's streams frozen a call). The text is measured first: past the limit it is
    refused in one line that says what to change, and nothing counts or renders it; at the
    limit it is taken."""
    counted: list[int] = []
    monkeypatch.setattr(
        "app.domain.conversation.estimate_prompt_tokens", lambda card, messages: counted.append(1) or 10
    )
    session = Session()
    long = "x" * (MAX_MESSAGE_CHARS + 1)
    with pytest.raises(ConversationError) as refused:
        asyncio.run(make_turn(session, long, [], decoder, 8))
    line = str(refused.value)
    assert f"{MAX_MESSAGE_CHARS + 1:,} characters" in line and f"at most {MAX_MESSAGE_CHARS:,}" in line
    assert "shorten" in line and "\n" not in line
    turn, _ = asyncio.run(make_turn(session, "x" * MAX_MESSAGE_CHARS, [], decoder, 8))
    with pytest.raises(ConversationError, match=r"The system prompt is .* characters.*at most"):
        asyncio.run(fitted_prompt(TINY, [turn], long, decoder))
    # A conversation reopened from an imported history can hold a turn no box would take.
    with pytest.raises(ConversationError, match=r"An earlier message .* characters.*: start a new chat\.$"):
        asyncio.run(fitted_prompt(TINY, [Turn(text=long), turn], None, decoder))
    assert counted == []
    assert asyncio.run(fitted_prompt(TINY, [turn], "Be brief.", decoder)).size == 10
    session.close()


def test_the_prompt_is_counted_off_the_event_loop(monkeypatch: pytest.MonkeyPatch, decoder: VideoDecoderPool):
    """Counting a long prompt with the model's tokenizer takes a tenth of a second or more at the
    length limit: in the loop's thread, every other visitor's stream would wait for it."""
    threads: list[bool] = []

    def count(card: ModelCard, messages: Any) -> int:
        try:
            asyncio.get_running_loop()
            threads.append(True)
        except RuntimeError:
            threads.append(False)
        return 10**6  # too long: refused, and counted again for the refusal's line

    monkeypatch.setattr("app.domain.conversation.estimate_prompt_tokens", count)
    with pytest.raises(ConversationError):
        asyncio.run(fitted_prompt(TINY, [Turn(text="hello")], None, decoder))
    assert threads and not any(threads), "counted in the event loop's thread"


def test_the_engine_gets_the_whole_conversation_in_order(decoder: VideoDecoderPool):
    session = Session()
    first = Turn("what is this?", images=[session.keep(EXAMPLES / "shapes.png")])
    first.reply = Reply("tiny", "Tiny", "org/tiny", answer="shapes")
    second = Turn("and this?", images=[session.keep(EXAMPLES / "bar_chart.png")])
    messages = asyncio.run(engine_messages([first, second], "Be brief.", decoder, 16))
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "user"]
    assert messages[2]["content"] == "shapes"
    assert [part["type"] for part in messages[3]["content"]] == ["image", "text"]
    hashes = [messages[i]["content"][0]["image"].info["content_hash"] for i in (1, 3)]
    assert hashes[0] != hashes[1]
    assert asyncio.run(engine_messages([second], None, decoder, 16))[0]["role"] == "user"
    session.close()


def test_only_our_own_errors_reach_the_user():
    assert user_message(EngineError("The model failed to load.")) == "The model failed to load."
    assert user_message(KeyError("/srv/app/secret/path")) == INTERNAL_ERROR


def test_a_stop_takes_while_the_stream_waits_and_closes_it():
    """The chat looked at its Stop only when a piece of the answer came: pressed while the engine
    handed on nothing (a long first token, a video's prefill, a busy engine), it took only at
    the next piece. `until_stopped` looks while it waits too, and cancels the wait inside the
    stream, which closes it (as the page's Stop closes the manager's stream: its request aborted)."""
    closed: list[str] = []
    stop = {"pressed": False}

    async def stalls_after_two() -> Any:
        try:
            yield "a"
            yield "b"
            await asyncio.sleep(3600)  # an engine that hands on nothing for now
            yield "never"
        finally:
            closed.append("closed")

    async def consume() -> list[str]:
        got = []
        async for piece in until_stopped(stalls_after_two(), lambda: stop["pressed"], every_s=0.01):
            got.append(piece)
            if piece == "b":
                asyncio.get_running_loop().call_later(0.05, stop.update, {"pressed": True})
        return got

    assert asyncio.run(asyncio.wait_for(consume(), 5)) == ["a", "b"]
    assert closed == ["closed"]

    async def whole(pieces: int) -> list[int]:
        async def counts() -> Any:
            for piece in range(pieces):
                await asyncio.sleep(0)
                yield piece

        return [piece async for piece in until_stopped(counts(), lambda: False, every_s=0.01)]

    assert asyncio.run(whole(5)) == [0, 1, 2, 3, 4]


def test_a_tab_closed_while_a_stop_is_cleaned_up_still_ends_the_handler():
    """A stop cancels the wait inside the stream and waits for it to close (its request's abort
    takes a moment); a cancellation of the handler itself meanwhile (the tab closed) was
    swallowed with the wait's own, and the handler went on to store and show the answer."""
    pressed = {"now": False}

    async def slow_to_close() -> Any:
        try:
            yield "a"
            await asyncio.sleep(3600)
        finally:
            await asyncio.sleep(0.3)  # the abort, under way

    async def handler() -> str:
        async for _ in until_stopped(slow_to_close(), lambda: pressed["now"], every_s=0.01):
            asyncio.get_running_loop().call_later(0.02, pressed.update, {"now": True})
        return "went on after the tab closed"

    async def close_the_tab_mid_stop() -> None:
        task = asyncio.create_task(handler())
        await asyncio.sleep(0.15)  # stopped at about 0.03 s; the abort runs until about 0.33 s
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(close_the_tab_mid_stop())
