"""A user's conversation: files kept per session, limits and size checked before sending."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from PIL import Image

from app.catalog.cards import load_cards
from app.demo.models import twin_card
from app.domain.conversation import (
    INTERNAL_ERROR,
    ConversationError,
    Session,
    Turn,
    check_fits,
    check_media,
    engine_messages,
    estimate_prompt_tokens,
    make_turn,
    user_message,
)
from app.domain.replies import Reply
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


def test_media_the_model_cannot_take_is_refused_counting_the_whole_conversation():
    image_only = CARDS["blip-2"]
    with pytest.raises(ConversationError, match="does not take videos"):
        check_media(image_only, [], ["clip.mp4"])
    with pytest.raises(ConversationError, match="at most 1 image per conversation"):
        check_media(image_only, [], ["a.png", "b.png"])
    with pytest.raises(ConversationError, match="already has 1"):
        check_media(image_only, [Turn("first", images=[Path("a.png")])], ["b.png"])
    check_media(TINY, [Turn("first", images=[Path("a.png")] * 3)], ["b.png"])
    with pytest.raises(ConversationError, match="at most 1 video"):
        check_media(TINY, [Turn("first", video=Path("a.mp4"))], ["b.mp4"])


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
