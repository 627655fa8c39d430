"""Adapters render what the references render, and whole conversations in the same formats.

Expected values come from executing the reference scripts (see references.py), never from
strings copied into the tests.
"""

from __future__ import annotations

import re

import pytest
import references as ref
from references import StubTokenizer

from app.catalog.adapters import PromptError, render, stop_token_ids
from app.catalog.cards import ModelCard, load_cards

CARDS = load_cards()
QUESTIONS = [
    "What is the content of this image?",
    "Describe it in detail, {please}: 3 lines.",
    "¿Dónde está? 用中文回答。",
]
# Models whose reference prompt ignores the question: the chat input that reproduces it.
REFERENCE_INPUT_TEXT = {"paligemma": "", "paligemma2": "", "florence2": ""}

CARD_MODALITIES = [(key, m) for key, card in CARDS.items() for m in card.modalities]


def media_part(modality: str, item: object) -> dict:
    return {"type": modality, modality: item}


def user(text: str, *media: tuple[str, object]) -> dict:
    return {
        "role": "user",
        "content": [media_part(m, item) for m, item in media] + [{"type": "text", "text": text}],
    }


def reference_conversations(recorded: ref.Recorded) -> list:
    """The conversations a reference handed to the tokenizer, one per question."""
    calls = recorded.tokenizer_messages
    if len(calls) == 1 and calls[0] and isinstance(calls[0][0], list):
        return calls[0]
    return calls


def test_every_reference_model_has_a_card_named_by_its_key():
    assert len(ref.all_reference_keys()) == 62
    assert sorted(CARDS) == sorted(ref.all_reference_keys())


def test_card_modalities_are_the_ones_the_reference_runs():
    for key, card in CARDS.items():
        assert card.modalities == ref.reference_modalities(key), key


@pytest.mark.parametrize(("key", "modality"), CARD_MODALITIES)
def test_single_turn_prompt_equals_the_reference(key: str, modality: str):
    card = CARDS[key]
    recorded = ref.run_reference(key, QUESTIONS, modality)
    expected_conversations = reference_conversations(recorded)
    for position, question in enumerate(QUESTIONS):
        text = REFERENCE_INPUT_TEXT.get(key, question)
        tokenizer = StubTokenizer()
        rendered = render(card, [user(text, (modality, "MEDIA"))], tokenizer)
        assert rendered.prompt == recorded.prompts[position]
        assert rendered.stop_token_ids == (recorded.stop_token_ids or [])
        assert getattr(rendered, modality + "s") == ["MEDIA"]
        if card.adapter == "chat_template":
            assert tokenizer.calls == [expected_conversations[position]]


@pytest.mark.parametrize("key", sorted(REFERENCE_INPUT_TEXT))
def test_task_prompt_models_take_the_users_task_verbatim(key: str):
    card = CARDS[key]
    task = "answer en what colour is the car?" if key.startswith("paligemma") else "<OCR>"
    assert render(card, [user(task, ("image", "IMG"))]).prompt == task


def test_text_free_model_gives_the_reference_prompt_whatever_the_user_writes():
    card = CARDS["lightonocr"]
    expected = ref.run_reference("lightonocr", ["x"], "image").prompts[0]
    assert render(card, [user("please transcribe", ("image", "IMG"))]).prompt == expected


def _comparable(args: dict) -> dict:
    return {k: v for k, v in args.items() if k != "disable_mm_preprocessor_cache"}


@pytest.mark.parametrize(("key", "modality"), CARD_MODALITIES)
def test_engine_args_equal_the_reference_except_documented_overrides(key: str, modality: str):
    card = CARDS[key]
    recorded = ref.run_reference(key, ["q"], modality)
    # The older copy passes its command-line switch through; 002 passes such switches in main().
    expected = _comparable(recorded.engine_kwargs)
    expected["model"] = expected["model"].removeprefix(ref.SNAPSHOT_ROOT)
    overridden = set(card.engine_overrides.args) if card.engine_overrides else set()
    if modality == card.modalities[0]:
        assert card.reference_engine_args == expected
    strip = lambda args: {k: v for k, v in args.items() if k not in overridden | {"revision"}}  # noqa: E731
    assert strip(card.engine_args) == strip(expected)
    for name, value in (card.engine_overrides.args if card.engine_overrides else {}).items():
        assert card.engine_args[name] == value
    assert card.revision == (recorded.revisions[0] if recorded.revisions else None)
    if card.revision:
        assert card.engine_args["revision"] == card.revision


@pytest.mark.parametrize("key", sorted(CARDS))
def test_lora_and_sampling_defaults_equal_the_reference(key: str):
    card = CARDS[key]
    recorded = ref.run_reference(key, ["q"], card.modalities[0])
    if recorded.lora:
        name, lora_id, path = recorded.lora[0]
        assert (card.lora.name, card.lora.id) == (name, lora_id)
        assert path == f"{ref.SNAPSHOT_ROOT}{card.hf_repo}/{card.lora.subpath}"
    else:
        assert card.lora is None
    if recorded.sampling:
        expected = dict(recorded.sampling[0])
        extra = dict(expected["extra_args"])
        extra["whitelist_token_ids"] = sorted(extra["whitelist_token_ids"])
        assert card.sampling_defaults == {**expected, "extra_args": extra}
    else:
        assert card.sampling_defaults == {}


# Where the pinned vLLM asks for more than its example sends: its Qwen2.5-VL processor refuses a
# video without the frames' metadata (found by the Qwen2.5-VL twin, tests/test_twins.py).
ENGINE_REQUIRES_VIDEO_METADATA = {"qwen2_5_vl"}


def test_video_metadata_flag_matches_the_reference_list():
    flagged = sorted(k for k, c in CARDS.items() if c.video_metadata)
    assert flagged == sorted(set(ref.newest_video_metadata_models()) | ENGINE_REQUIRES_VIDEO_METADATA)


# --- several images -------------------------------------------------------------------------


@pytest.mark.parametrize("key", ref.multi_image_keys())
@pytest.mark.parametrize("count", [2, 3])
def test_multi_image_notebook_formats_are_reproduced(key: str, count: int):
    card = CARDS[key]
    urls = [f"https://example.invalid/{i}.jpg" for i in range(count)]
    question = "What is the content of each image?"
    recorded = ref.run_multi_image(key, question, urls)
    tokenizer = StubTokenizer()
    rendered = render(card, [user(question, *(("image", u) for u in urls))], tokenizer)
    assert rendered.prompt == recorded.prompts[0]
    assert rendered.images == urls
    assert tokenizer.calls == recorded.tokenizer_messages
    assert card.multi_image and card.media_limits["image"] >= count


def test_usage_guide_phi3_two_image_prompt_is_reproduced():
    expected = ref.usage_guide_phi3_prompt()
    question = expected.split("<|image_2|>\n")[1].split("<|end|>")[0]
    rendered = render(CARDS["phi3_v"], [user(question, ("image", "a"), ("image", "b"))])
    assert rendered.prompt == expected


# --- whole conversations ---------------------------------------------------------------------

MULTI_TURN = sorted(k for k, c in CARDS.items() if c.multi_turn)
SINGLE_TURN = sorted(k for k, c in CARDS.items() if not c.multi_turn)


def conversation(card: ModelCard) -> tuple[list[dict], list, list]:
    """Three user turns across which the card's media spread, with earlier answers."""
    first_media = "image" if "image" in card.modalities else "video"
    images = ["img-1", "img-2"] if card.multi_image else ["img-1"]
    turn1 = [(first_media, m) for m in (images if first_media == "image" else ["vid-1"])]
    turn2 = [("video", "vid-1")] if first_media == "image" and "video" in card.modalities else []
    messages = [
        user("First question?", *turn1),
        {"role": "assistant", "content": "First answer."},
        user("Second question?", *turn2),
        {"role": "assistant", "content": [{"type": "text", "text": "Second answer."}]},
        user("Third question?"),
    ]
    all_media = turn1 + turn2
    return (
        messages,
        [m for kind, m in all_media if kind == "image"],
        [m for kind, m in all_media if kind == "video"],
    )


@pytest.mark.parametrize("key", MULTI_TURN)
def test_multi_turn_conversation_replays_history_in_the_models_format(key: str):
    card = CARDS[key]
    messages, images, videos = conversation(card)
    tokenizer = StubTokenizer()
    full = render(card, messages, tokenizer)
    assert full.images == images and full.videos == videos
    if card.adapter == "format" and not (
        card.prompt_spec.several_images_via_chat_template and len(images) > 1
    ):
        # The model sees the history exactly as it was when it wrote each answer.
        first = render(card, messages[:1], tokenizer).prompt
        second = render(card, messages[:3], tokenizer).prompt
        assert full.prompt.startswith(first + "First answer.")
        assert full.prompt.startswith(second + "Second answer.")
        assert full.prompt.endswith(card.prompt_spec.generation)
        for modality, media in (("image", images), ("video", videos)):
            placeholder = card.prompt_spec.placeholder(modality)
            if media and placeholder and "{index}" not in placeholder:
                several = card.prompt_spec.image_several if modality == "image" and len(media) > 1 else None
                assert full.prompt.count(several or placeholder) == len(media)
            elif media and placeholder:
                for index in range(1, len(media) + 1):
                    assert placeholder.replace("{index}", str(index)) in full.prompt
    else:
        sent = tokenizer.calls[-1]
        assert [m["role"] for m in sent] == ["user", "assistant", "user", "assistant", "user"]
        answers = [m["content"] for m in sent if m["role"] == "assistant"]
        assert answers in (
            ["First answer.", "Second answer."],
            [[{"type": "text", "text": "First answer."}], [{"type": "text", "text": "Second answer."}]],
        )
        assert full.prompt == StubTokenizer.render(sent)


@pytest.mark.parametrize("key", sorted(k for k in MULTI_TURN if CARDS[k].adapter == "chat_template"))
def test_chat_template_user_turns_are_the_references_messages(key: str):
    """Each user turn with media is the message the reference builds for that media and text."""
    card = CARDS[key]
    first, last = card.modalities[0], card.modalities[-1]
    room_for_second = last != first or card.media_limits[first] >= 2
    second_media = [(last, "m2")] if room_for_second else []
    tokenizer = StubTokenizer()
    messages = [
        user("First question?", (first, "m1")),
        {"role": "assistant", "content": "First answer."},
        user("Second question?", *second_media),
    ]
    render(card, messages, tokenizer)
    sent = tokenizer.calls[-1]
    assert sent[0] == reference_conversations(ref.run_reference(key, ["First question?"], first))[0][0]
    if room_for_second:
        expected = reference_conversations(ref.run_reference(key, ["Second question?"], last))[0][0]
    else:
        text_only = (
            "Second question?"
            if card.prompt_spec.content == "string"
            else [{"type": "text", "text": "Second question?"}]
        )
        expected = {"role": "user", "content": text_only}
    assert sent[2] == expected


@pytest.mark.parametrize("key", SINGLE_TURN)
def test_single_turn_models_answer_the_latest_message_about_the_latest_media(key: str):
    card = CARDS[key]
    messages = [
        user("caption en" if key != "florence2" else "<CAPTION>", ("image", "old")),
        {"role": "assistant", "content": "An answer."},
        user("first", ("image", "img")),
        {"role": "assistant", "content": "Another answer."},
        user("follow-up question"),
    ]
    rendered = render(card, messages)
    alone = render(card, [user("follow-up question", ("image", "img"))])
    assert rendered == alone
    assert "An answer." not in rendered.prompt


def test_phi3_numbers_images_across_the_whole_conversation():
    card = CARDS["phi3_v"]
    messages = [
        user("Compare.", ("image", "a"), ("image", "b")),
        {"role": "assistant", "content": "They differ."},
        user("And this one?", ("image", "c")),
    ]
    rendered = render(card, messages)
    assert [rendered.prompt.count(f"<|image_{i}|>") for i in (1, 2, 3)] == [1, 1, 1]
    assert rendered.prompt.index("<|image_2|>") < rendered.prompt.index("They differ.")
    assert rendered.prompt.index("They differ.") < rendered.prompt.index("<|image_3|>")
    assert rendered.images == ["a", "b", "c"]


def test_system_prompt_replaces_the_default_one():
    card = CARDS["qwen2_5_vl"]
    messages = [{"role": "system", "content": "Answer in French."}, user("Hi?", ("image", "i"))]
    prompt = render(card, messages).prompt
    assert prompt.startswith("<|im_start|>system\nAnswer in French.<|im_end|>\n")
    assert "You are a helpful assistant." not in prompt


def test_user_text_with_template_fields_is_not_substituted():
    card = CARDS["qwen2_5_vl"]
    prompt = render(card, [user("{media} and {text} stay", ("image", "i"))]).prompt
    assert "{media} and {text} stay<|im_end|>" in prompt
    assert prompt.count("<|image_pad|>") == 1


def test_string_content_means_text_only():
    card = CARDS["qwen2_5_vl"]
    prompt = render(card, [{"role": "user", "content": "Just text."}]).prompt
    assert "<|im_start|>user\nJust text.<|im_end|>" in prompt and "<|vision_start|>" not in prompt


# --- refusals --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("key", "messages", "message_part"),
    [
        (
            "llava",
            [{"role": "system", "content": "Be brief."}, user("Hi", ("image", "i"))],
            "no system prompt",
        ),
        ("llava", [user("Hi", ("video", "v"))], "does not take videos"),
        ("paligemma", [user("Hi", ("image", "a"), ("image", "b"))], "at most 1 image"),
        ("qwen2_5_vl", [user("Hi"), {"role": "assistant", "content": "Yes"}], "must end with a user message"),
        ("qwen2_5_vl", [], "empty"),
        ("qwen2_5_vl", [{"role": "robot", "content": "x"}], "role 'robot'"),
        ("qwen2_5_vl", [{"role": "user", "content": [{"type": "audio", "audio": "x"}]}], "unknown type"),
        ("qwen2_5_vl", [{"role": "user", "content": [{"type": "image", "image": None}]}], "empty image"),
        ("qwen2_5_vl", [user("Hi"), {"role": "system", "content": "late"}, user("x")], "only come first"),
        ("aria", [user("Hi", *(("image", str(i)) for i in range(5)))], "at most 4 image"),
    ],
)
def test_refusals_are_clear(key: str, messages: list, message_part: str):
    with pytest.raises(PromptError, match=re.escape(message_part)):
        render(CARDS[key], messages, StubTokenizer())


def test_chat_template_cards_need_the_tokenizer():
    with pytest.raises(PromptError, match="tokenizer"):
        render(CARDS["internvl_chat"], [user("Hi", ("image", "i"))])
    with pytest.raises(PromptError, match="tokenizer"):
        stop_token_ids(CARDS["internvl_chat"], None)


def test_literal_stop_ids_need_no_tokenizer():
    assert stop_token_ids(CARDS["glm4v"], None) == [151329, 151336, 151338]


class MinimalTokenizer:
    """Only what the public surface promises: the chat template and token-to-id lookups."""

    def apply_chat_template(self, messages, tokenize=True, add_generation_prompt=False):
        return StubTokenizer.render(messages)

    def convert_tokens_to_ids(self, token):
        return {"<|im_end|>": 7}.get(token)


@pytest.mark.parametrize("key", sorted(k for k, c in CARDS.items() if c.adapter == "chat_template"))
def test_chat_template_cards_work_with_a_minimal_tokenizer(key: str):
    card = CARDS[key]
    rendered = render(card, [user("Hi", (card.modalities[0], "m"))], MinimalTokenizer())
    assert rendered.prompt.startswith("TEMPLATE") and all(isinstance(i, int) for i in rendered.stop_token_ids)
