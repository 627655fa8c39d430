"""Prompt adapters: render a whole conversation into one model's prompt.

A conversation is a list of messages in the OpenAI/Hugging Face shape::

    {"role": "system" | "user" | "assistant",
     "content": "text" | [{"type": "text", "text": ...},
                          {"type": "image", "image": <PIL image or path>},
                          {"type": "video", "video": <frames or path>}]}

Each model card names its adapter; adapters are registered here by name and each declares the
strict schema of the card's `prompt` section. Rendering gives the prompt string, the images and
videos in the order of their placeholders, and the stop token ids.

Two adapters:
- `format`: the card declares the prompt format (turn templates and placeholders), as the
  reference examples write it by hand.
- `chat_template`: the model's own tokenizer (or processor) chat template renders messages that
  the adapter builds exactly as the reference builds them.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Literal, Protocol

from pydantic import BaseModel, ConfigDict, model_validator

if TYPE_CHECKING:
    from app.catalog.cards import ModelCard

MODALITIES = ("image", "video")
ROLES = ("system", "user", "assistant")


class PromptError(ValueError):
    """A conversation this model cannot take; the message is meant for the user."""


class ChatTemplateOwner(Protocol):
    """What chat-template rendering needs: a Hugging Face tokenizer or processor."""

    def apply_chat_template(
        self, conversation: Any, tokenize: bool = ..., add_generation_prompt: bool = ...
    ) -> Any: ...

    def convert_tokens_to_ids(self, tokens: str) -> Any: ...


@dataclass(frozen=True)
class Turn:
    role: str
    text: str
    images: tuple[Any, ...] = ()
    videos: tuple[Any, ...] = ()


@dataclass(frozen=True)
class RenderedPrompt:
    prompt: str
    images: list[Any] = field(default_factory=list)
    videos: list[Any] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)


# --- conversation --------------------------------------------------------------------------


def to_turns(messages: Sequence[dict[str, Any]]) -> list[Turn]:
    """Checks a conversation's shape and flattens each message into text plus media."""
    if not messages:
        raise PromptError("The conversation is empty: send a message first.")
    turns = []
    for position, message in enumerate(messages):
        role = message.get("role") if isinstance(message, dict) else None
        if role not in ROLES:
            raise PromptError(f"Message {position + 1} has role {role!r}; expected one of {ROLES}.")
        if role == "system" and position != 0:
            raise PromptError("A system prompt can only come first in the conversation.")
        turn = _to_turn(role, message.get("content"), position)
        _check_text(turn.text, role)
        turns.append(turn)
    if turns[-1].role != "user":
        raise PromptError("The conversation must end with a user message for the model to answer.")
    return turns


def _check_text(text: str, role: str) -> None:
    """Refuses text that cannot be encoded (a lone surrogate: half of a character, as broken
    copy-paste or an API client can send), which no tokenizer takes."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        where = {"system": "The system prompt", "assistant": "An earlier answer"}.get(role, "The message")
        code = f"U+{ord(text[error.start]):04X}"
        raise PromptError(
            f"{where} holds a broken character ({code}, half of a surrogate pair) at position "
            f"{error.start + 1}: delete it or paste the text again."
        ) from None


def _to_turn(role: str, content: Any, position: int) -> Turn:
    if content is None:
        content = ""
    if isinstance(content, str):
        return Turn(role, content)
    if not isinstance(content, list):
        raise PromptError(f"Message {position + 1} has content of an unknown kind.")
    texts: list[str] = []
    media: dict[str, list[Any]] = {m: [] for m in MODALITIES}
    for part in content:
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "text":
            texts.append(str(part.get("text", "")))
        elif kind in MODALITIES:
            if part.get(kind) is None:
                raise PromptError(f"Message {position + 1} has an empty {kind} part.")
            media[kind].append(part[kind])
        else:
            raise PromptError(f"Message {position + 1} has a part of unknown type {kind!r}.")
    if role != "user" and (media["image"] or media["video"]):
        raise PromptError("Only user messages can carry images or videos.")
    return Turn(role, "\n".join(texts), tuple(media["image"]), tuple(media["video"]))


# --- templates -----------------------------------------------------------------------------

_FIELD = re.compile(r"\{(\w+)\}")


def fill(template: str, **values: str | int) -> str:
    """Substitutes {name} fields in one pass, so braces in user text are never re-read."""
    return _FIELD.sub(lambda m: str(values[m.group(1)]) if m.group(1) in values else m.group(0), template)


def _check_fields(name: str, template: str | None, allowed: set[str]) -> None:
    if template is None:
        return
    unknown = set(_FIELD.findall(template)) - allowed
    if unknown:
        raise ValueError(f"{name} uses unknown field(s) {sorted(unknown)}; allowed: {sorted(allowed)}")


class Spec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class PlaceholderSpec(Spec):
    """How a user turn's media are written into text: one placeholder per item.

    `{index}` counts items of that modality over the whole conversation, from 1. A turn's
    placeholders are joined and wrapped in `media_block`. `image_several` replaces `image` in a
    turn with more than one image, where the references write several images differently.
    """

    image: str | None = None
    image_several: str | None = None
    video: str | None = None
    media_block: str = "{items}"

    @model_validator(mode="after")
    def _placeholder_fields(self) -> PlaceholderSpec:
        for name in ("image", "image_several", "video"):
            _check_fields(name, getattr(self, name), {"index"})
        _check_fields("media_block", self.media_block, {"items"})
        return self

    def placeholder(self, modality: str) -> str | None:
        return getattr(self, modality)

    def write_media(self, turn: Turn, counts: dict[str, int]) -> str:
        items = []
        for modality, media in (("image", turn.images), ("video", turn.videos)):
            template = self.placeholder(modality)
            if modality == "image" and len(media) > 1 and self.image_several is not None:
                template = self.image_several
            for _ in media:
                counts[modality] += 1
                items.append(fill(template or "", index=counts[modality]))
        return fill(self.media_block, items="".join(items)) if items else ""


def _media_in_order(turns: Sequence[Turn]) -> tuple[list[Any], list[Any]]:
    images = [image for turn in turns for image in turn.images]
    videos = [video for turn in turns for video in turn.videos]
    return images, videos


# --- registry ------------------------------------------------------------------------------


class Adapter(Protocol):
    Spec: ClassVar[type[Spec]]

    def check(self, spec: Any, modalities: Sequence[str]) -> None: ...

    def render(
        self, spec: Any, turns: list[Turn], tokenizer: ChatTemplateOwner | None
    ) -> tuple[str, list[Any], list[Any]]: ...


ADAPTERS: dict[str, Adapter] = {}


def register(name: str) -> Callable[[type], type]:
    def add(cls: type) -> type:
        ADAPTERS[name] = cls()
        return cls

    return add


def get_adapter(name: str) -> Adapter:
    try:
        return ADAPTERS[name]
    except KeyError:
        raise ValueError(f"unknown adapter {name!r}; known: {sorted(ADAPTERS)}") from None


def parse_spec(adapter_name: str, prompt: dict[str, Any], modalities: Sequence[str]) -> Spec:
    """Validates a card's `prompt` section against its adapter's schema (used at load time)."""
    adapter = get_adapter(adapter_name)
    spec = adapter.Spec.model_validate(prompt)
    adapter.check(spec, modalities)
    return spec


def _require_placeholders(spec: PlaceholderSpec, modalities: Sequence[str]) -> None:
    for modality in modalities:
        if spec.placeholder(modality) is None:
            raise ValueError(f"the card accepts {modality} but its prompt has no {modality} placeholder")


# --- format adapter ------------------------------------------------------------------------


class FormatSpec(PlaceholderSpec):
    """A prompt format declared by the card.

    prompt = prefix + system + turns + generation. `user` takes `{media}` and `{text}`;
    `assistant` replays an earlier answer (`{text}`); a format without `assistant` is
    single-turn: the model answers the latest message on its own.
    """

    prefix: str = ""
    system: str | None = None
    default_system: str | None = None
    user: str
    assistant: str | None = None
    generation: str = ""
    # Text the model gets when the user sends media without words (task-prompt models).
    empty_text: str | None = None
    # The model reads no instruction: whatever the user writes, the prompt is the same.
    ignore_text: bool = False
    # Where the reference writes several images with the model's own chat template (001).
    several_images_via_chat_template: bool = False

    @model_validator(mode="after")
    def _format_fields(self) -> FormatSpec:
        _check_fields("user", self.user, {"media", "text"})
        for name in ("system", "assistant"):
            _check_fields(name, getattr(self, name), {"text"})
        for name in ("prefix", "generation", "default_system", "empty_text"):
            _check_fields(name, getattr(self, name), set())
        if self.default_system is not None and self.system is None:
            raise ValueError("default_system needs a system template")
        return self

    @property
    def multi_turn(self) -> bool:
        return self.assistant is not None


@register("format")
class FormatAdapter:
    Spec = FormatSpec

    def check(self, spec: FormatSpec, modalities: Sequence[str]) -> None:
        _require_placeholders(spec, modalities)

    def render(
        self, spec: FormatSpec, turns: list[Turn], tokenizer: ChatTemplateOwner | None
    ) -> tuple[str, list[Any], list[Any]]:
        system_text = turns[0].text if turns[0].role == "system" else spec.default_system
        dialogue = [turn for turn in turns if turn.role != "system"]
        if turns[0].role == "system" and spec.system is None:
            raise PromptError("This model's prompt format has no system prompt; leave it empty.")
        if not spec.multi_turn:
            dialogue = [_latest_message_with_media(dialogue)]
        if spec.several_images_via_chat_template and any(len(t.images) > 1 for t in dialogue):
            system = [Turn("system", system_text)] if turns[0].role == "system" else []
            return ChatTemplateAdapter().render(SEVERAL_IMAGES_SPEC, system + dialogue, tokenizer)

        counts = dict.fromkeys(MODALITIES, 0)
        parts = [spec.prefix]
        if spec.system is not None and system_text is not None:
            parts.append(fill(spec.system, text=system_text))
        for turn in dialogue:
            if turn.role == "user":
                media = spec.write_media(turn, counts)
                parts.append(fill(spec.user, media=media, text=self._user_text(spec, turn)))
            else:
                parts.append(fill(spec.assistant or "", text=turn.text))
        parts.append(spec.generation)
        return ("".join(parts), *_media_in_order(dialogue))

    @staticmethod
    def _user_text(spec: FormatSpec, turn: Turn) -> str:
        if spec.ignore_text:
            return ""
        if not turn.text.strip() and spec.empty_text is not None:
            return spec.empty_text
        return turn.text


def _latest_message_with_media(dialogue: list[Turn]) -> Turn:
    """A single-turn model answers the latest message; it reuses the latest media if that
    message has none, so a follow-up question still refers to the picture on screen."""
    latest = dialogue[-1]
    if latest.images or latest.videos:
        return latest
    for turn in reversed(dialogue[:-1]):
        if turn.images or turn.videos:
            return Turn("user", latest.text, turn.images, turn.videos)
    return latest


# --- chat-template adapter -----------------------------------------------------------------


class ChatTemplateSpec(PlaceholderSpec):
    """Messages for the model's own chat template, built as the reference builds them.

    `content: string` writes placeholders into the message text (`<image>\\n{question}`);
    `content: parts` gives typed parts (`{"type": "image"}` then `{"type": "text", ...}`), with
    any extra keys the reference sets on them and, if `part_carries_media`, the media itself.
    """

    content: Literal["string", "parts"]
    image_part: dict[str, Any] = {}
    video_part: dict[str, Any] = {}
    part_carries_media: bool = False


# What the multi-image notebook (001) hands the processor for gemma3, llava, llava-onevision.
SEVERAL_IMAGES_SPEC = ChatTemplateSpec(content="parts", part_carries_media=True)


@register("chat_template")
class ChatTemplateAdapter:
    Spec = ChatTemplateSpec

    def check(self, spec: ChatTemplateSpec, modalities: Sequence[str]) -> None:
        if spec.content == "string":
            _require_placeholders(spec, modalities)

    def render(
        self, spec: ChatTemplateSpec, turns: list[Turn], tokenizer: ChatTemplateOwner | None
    ) -> tuple[str, list[Any], list[Any]]:
        if tokenizer is None:
            raise PromptError("This model's prompt comes from its own chat template; load its tokenizer.")
        messages = self.messages(spec, turns)
        prompt = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return (prompt, *_media_in_order(turns))

    def messages(self, spec: ChatTemplateSpec, turns: list[Turn]) -> list[dict[str, Any]]:
        counts = dict.fromkeys(MODALITIES, 0)
        messages: list[dict[str, Any]] = []
        for turn in turns:
            if turn.role == "user" and spec.content == "string":
                content: Any = spec.write_media(turn, counts) + turn.text
            elif turn.role == "user":
                content = self._parts(spec, turn)
            elif turn.role == "assistant" and spec.content == "parts":
                content = [{"type": "text", "text": turn.text}]
            else:
                content = turn.text
            messages.append({"role": turn.role, "content": content})
        return messages

    @staticmethod
    def _parts(spec: ChatTemplateSpec, turn: Turn) -> list[dict[str, Any]]:
        parts: list[dict[str, Any]] = []
        for modality, media, extra in (
            ("image", turn.images, spec.image_part),
            ("video", turn.videos, spec.video_part),
        ):
            for item in media:
                part = {"type": modality, **extra}
                if spec.part_carries_media:
                    part[modality] = item
                parts.append(part)
        if turn.text:
            parts.append({"type": "text", "text": turn.text})
        return parts


# --- public entry point --------------------------------------------------------------------


def render(
    card: ModelCard, messages: Sequence[dict[str, Any]], tokenizer: ChatTemplateOwner | None = None
) -> RenderedPrompt:
    """Renders a conversation into `card`'s prompt with its media and stop token ids."""
    turns = to_turns(messages)
    _check_modalities(card, turns)
    prompt, images, videos = get_adapter(card.adapter).render(card.prompt_spec, turns, tokenizer)
    _check_limits(card, {"image": len(images), "video": len(videos)})
    return RenderedPrompt(prompt, images, videos, stop_token_ids(card, tokenizer))


def _check_modalities(card: ModelCard, turns: list[Turn]) -> None:
    for modality in MODALITIES:
        if modality not in card.modalities and any(getattr(t, modality + "s") for t in turns):
            accepted = " and ".join(f"{m}s" for m in card.modalities)
            raise PromptError(f"{card.display_name} does not take {modality}s; it takes {accepted}.")


def _check_limits(card: ModelCard, counts: dict[str, int]) -> None:
    limits = card.media_limits
    for modality, count in counts.items():
        limit = limits.get(modality, 0)
        if count > limit:
            raise PromptError(
                f"{card.display_name} takes at most {limit} {modality}(s) per prompt here, "
                f"and this one has {count}: send fewer {modality}s in one message."
            )


def stop_token_ids(card: ModelCard, tokenizer: ChatTemplateOwner | None) -> list[int]:
    """The card's literal ids, then the ids of its stop tokens (unknown tokens dropped)."""
    ids = list(card.stop_token_ids)
    if card.stop_tokens or card.stop_on_eos_token:
        if tokenizer is None:
            raise PromptError("This model's stop tokens come from its tokenizer; load it first.")
        for token in card.stop_tokens:
            token_id = tokenizer.convert_tokens_to_ids(token)
            if token_id is not None:
                ids.append(token_id)
        # vLLM stops at the end-of-sequence token anyway; the id is listed where the tokenizer
        # has one, as the reference does, and a tokenizer without it loses nothing.
        eos_token_id = getattr(tokenizer, "eos_token_id", None)
        if card.stop_on_eos_token and eos_token_id is not None:
            ids.append(eos_token_id)
    return ids
