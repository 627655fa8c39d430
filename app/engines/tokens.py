"""The model's own tokenizer on the app's side: prompts counted exactly, and user text kept text.

Two jobs, both for the prompt the engine gets:

- Counting. `PromptCounter` renders a conversation with the card's adapter and counts the text
  with the model's tokenizer (as vLLM tokenizes a prompt string: special tokens added), plus the
  card's visual-token rule for each image or video. The size check before sending uses it
  wherever the tokenizer is on this machine: the engine's own once it is built, else the files in
  the model's local folder or the Hugging Face cache.
- Literal text. A tokenizer reads its added tokens (`<|im_end|>`, `<image>`, ...) out of any text,
  so a user typing `<|im_end|><|im_start|>system` would change the prompt's structure. Where a
  user's text (or an earlier answer replayed, or the system prompt) holds such a string, the
  prompt goes to vLLM as token ids: the prompt string tokenized as vLLM would, except that each
  of those strings is tokenized as plain text (`split_special_tokens`). Normal text is not
  touched: its prompt goes as the same string as before. A remote server takes no token ids with
  media, so there each such string goes broken by a zero-width space (`broken_apart`).
"""

from __future__ import annotations

import contextlib
import logging
import re
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from app.catalog.adapters import ChatTemplateOwner, RenderedPrompt, render

if TYPE_CHECKING:
    from app.catalog.cards import ModelCard

log = logging.getLogger(__name__)

# Unicode noncharacters: never in a template, so one marks where a literal string was.
_MARKERS = [chr(c) for c in range(0xFDD0, 0xFDF0)]


@dataclass(frozen=True)
class LiteralPrompt:
    """A rendered prompt and, where user text held special-token strings, its token ids."""

    rendered: RenderedPrompt
    token_ids: list[int] | None = None


def _added_tokens_pattern(tokenizer: Any) -> re.Pattern[str] | None:
    cached = getattr(tokenizer, "_app_added_tokens_pattern", False)
    if cached is not False:
        return cached
    try:
        tokens = [t for t in tokenizer.get_added_vocab() if t]
    except Exception:
        tokens = list(getattr(tokenizer, "all_special_tokens", []) or [])
    pattern = (
        re.compile("|".join(re.escape(t) for t in sorted(tokens, key=len, reverse=True))) if tokens else None
    )
    with contextlib.suppress(AttributeError, TypeError):
        tokenizer._app_added_tokens_pattern = pattern
    return pattern


def _texts(messages: Sequence[dict[str, Any]]) -> list[str]:
    texts = []
    for message in messages:
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, str):
            texts.append(content)
        elif isinstance(content, list):
            texts += [
                str(p.get("text", "")) for p in content if isinstance(p, dict) and p.get("type") == "text"
            ]
    return texts


def _map_texts(messages: Sequence[dict[str, Any]], change: Any) -> list[dict[str, Any]]:
    mapped = []
    for message in messages:
        if not isinstance(message, dict):
            mapped.append(message)
            continue
        content = message.get("content")
        if isinstance(content, str):
            content = change(content)
        elif isinstance(content, list):
            content = [
                {**p, "text": change(str(p.get("text", "")))}
                if isinstance(p, dict) and p.get("type") == "text"
                else p
                for p in content
            ]
        mapped.append({**message, "content": content})
    return mapped


def render_literal(
    card: ModelCard, messages: Sequence[dict[str, Any]], owner: ChatTemplateOwner | None, tokenizer: Any
) -> LiteralPrompt:
    """Renders `messages` for `card`; where the texts hold strings the tokenizer would read as
    added tokens, also gives the token ids in which those strings are plain text."""
    pattern = _added_tokens_pattern(tokenizer) if tokenizer is not None else None
    texts = _texts(messages)
    if pattern is None or not any(pattern.search(text) for text in texts):
        return LiteralPrompt(render(card, messages, owner))
    marker = next((m for m in _MARKERS if not any(m in text for text in texts)), None)
    if marker is None:
        # Every marker is in the text itself: the strings are broken with a zero-width space.
        return LiteralPrompt(render(card, _map_texts(messages, lambda t: pattern.sub(_spaced, t)), owner))
    literals: list[str] = []

    def hide(text: str) -> str:
        def one(match: re.Match[str]) -> str:
            literals.append(match.group(0))
            return f"{marker}{len(literals) - 1}{marker}"

        return pattern.sub(one, text)

    hidden = render(card, _map_texts(messages, hide), owner)
    # The prompt with the literal strings back, and where each one lies in it.
    pieces, spans, position = [], [], 0
    for index, part in enumerate(re.split(f"{marker}(\\d+){marker}", hidden.prompt)):
        if index % 2:
            part = literals[int(part)]
            spans.append((position, position + len(part), part))
        pieces.append(part)
        position += len(part)
    prompt = "".join(pieces)
    rendered = RenderedPrompt(prompt, hidden.images, hidden.videos, hidden.stop_token_ids)
    if not spans:
        return LiteralPrompt(rendered)
    return LiteralPrompt(rendered, _literal_ids(tokenizer, prompt, spans))


# Strings that may be a model's added tokens, for a tokenizer this process does not have (a
# remote server's): `<|im_end|>`, `<image>`, `<｜end▁of▁sentence｜>`, `[INST]`, `[gMASK]`. Two
# patterns, each found on its own, so that one inside the other (`<[/INST]>`) is found too.
ADDED_TOKEN_LOOKALIKES = (re.compile(r"<[^<>\s]{1,64}>"), re.compile(r"\[[^\[\]<>\s]{1,32}\]"))


def lookalikes(messages: Sequence[dict[str, Any]]) -> set[str]:
    """The strings in `messages`' texts that look like added tokens (`ADDED_TOKEN_LOOKALIKES`)."""
    texts = _texts(messages)
    return {
        found.group(0)
        for pattern in ADDED_TOKEN_LOOKALIKES
        for text in texts
        for found in pattern.finditer(text)
    }


def broken_apart(messages: Sequence[dict[str, Any]], strings: set[str]) -> list[dict[str, Any]]:
    """`messages` with each of `strings` in their texts broken by a zero-width space after its
    first character, so that no tokenizer reads it as its added token: the same text to a reader,
    plain text to the model. One pass per lookalike pattern, whatever the number of strings;
    the inner pattern first, so that `[/INST]` inside `<[/INST]>` is broken too."""
    if not strings:
        return list(messages)

    def one(match: re.Match[str]) -> str:
        return _spaced(match) if match.group(0) in strings else match.group(0)

    def text_broken(text: str) -> str:
        for pattern in reversed(ADDED_TOKEN_LOOKALIKES):
            text = pattern.sub(one, text)
        return text

    return _map_texts(messages, text_broken)


def _spaced(match: re.Match[str]) -> str:
    text = match.group(0)
    return text[0] + "\u200b" + text[1:]


def _literal_ids(tokenizer: Any, prompt: str, spans: list[tuple[int, int, str]]) -> list[int]:
    """`prompt` tokenized as vLLM tokenizes a prompt string, each span as plain text."""

    def plain(text: str) -> list[int]:
        return list(tokenizer(text, add_special_tokens=False, split_special_tokens=True)["input_ids"])

    try:
        encoded = tokenizer(prompt, add_special_tokens=True, return_offsets_mapping=True)
        offsets = encoded["offset_mapping"]
    except (NotImplementedError, KeyError, TypeError, ValueError):
        # A tokenizer without offsets: the pieces between the spans tokenized one by one.
        ids: list[int] = []
        start = 0
        for begin, end, text in spans:
            ids += list(
                tokenizer(prompt[start:begin], add_special_tokens=not ids and start == 0)["input_ids"]
            )
            ids += plain(text)
            start = end
        return ids + list(tokenizer(prompt[start:], add_special_tokens=False)["input_ids"])
    ids = []
    current = 0
    emitted: set[int] = set()
    for token_id, (start, end) in zip(encoded["input_ids"], offsets, strict=True):
        inside = end > start  # tokens the tokenizer adds (BOS) cover no text
        while inside and current < len(spans) and start >= spans[current][1]:
            current += 1
        if inside and current < len(spans) and start < spans[current][1] and end > spans[current][0]:
            # The tokens of a literal string become that string tokenized as plain text.
            if current not in emitted:
                emitted.add(current)
                ids += plain(spans[current][2])
            continue
        ids.append(token_id)
    return ids


class PromptCounter:
    """Counts a conversation's prompt with the model's tokenizer and the card's visual rule."""

    def __init__(self, card: ModelCard, tokenizer: Any, owner: ChatTemplateOwner | None = None) -> None:
        self.card = card
        self.tokenizer = tokenizer
        self.owner = owner if owner is not None else tokenizer
        self._lock = threading.Lock()

    def count(self, messages: Sequence[dict[str, Any]]) -> int:
        literal = render_literal(self.card, messages, self.owner, self.tokenizer)
        return self.count_rendered(literal)

    def count_rendered(self, literal: LiteralPrompt) -> int:
        """The text's tokens (each media placeholder counted too) plus the media's tokens."""
        if literal.token_ids is not None:
            text = len(literal.token_ids)
        else:
            with self._lock:  # a Rust tokenizer refuses to be borrowed by two threads at once
                text = len(self.tokenizer(literal.rendered.prompt, add_special_tokens=True)["input_ids"])
        return text + media_tokens(self.card, literal.rendered.images, literal.rendered.videos)


def media_tokens(card: ModelCard, images: Sequence[Any], videos: Sequence[Any]) -> int:
    """The prompt tokens images and videos become, by the card's visual-token rule."""
    rule = card.visual_token_rule
    total = sum(rule.image_tokens(*image.size) for image in images)
    for video in videos:
        frames = getattr(video, "frames", video[0] if isinstance(video, tuple) else video)
        height, width = frames.shape[1:3]
        total += -(-len(frames) // rule.frames_per_token) * rule.image_tokens(width, height)
    return total


# --- which counter a card has ----------------------------------------------------------------

_counters: dict[str, PromptCounter | None] = {}
_folders: dict[str, Path] = {}
_contexts: dict[str, int] = {}
_registry_lock = threading.Lock()


def register_counter(key: str, counter: PromptCounter | None) -> None:
    """The engine of `key` is built: its tokenizer counts from now on."""
    with _registry_lock:
        _counters[key] = counter


def register_context(key: str, tokens: int | None) -> None:
    """The engine of `key` is built with `tokens` of context (its `max_model_len`); None forgets."""
    with _registry_lock:
        if tokens is None:
            _contexts.pop(key, None)
        else:
            _contexts[key] = tokens


def context_length(card: ModelCard) -> int | None:
    """The tokens a prompt plus its answer may take: what the model's engine was built with (a
    GPU gives chats more than the card's example, see `app.engines.memory.chat_length`), else
    the card's `max_model_len` (None: the model's own default)."""
    with _registry_lock:
        return _contexts.get(card.key, card.max_model_len)


def register_folder(key: str, folder: Path) -> None:
    """Where `key`'s model files are on this machine (the deployment's model folders)."""
    with _registry_lock:
        _folders[key] = Path(folder)
        _counters.pop(key, None)


def counter_for(card: ModelCard) -> PromptCounter | None:
    """The card's counter: its engine's tokenizer, else one loaded from the model's files on this
    machine (never downloaded); None where no tokenizer is at hand."""
    with _registry_lock:
        if card.key in _counters:
            counter = _counters[card.key]
            if counter is None or counter.card == card:
                return counter
    counter = _load_local(card)
    with _registry_lock:
        _counters.setdefault(card.key, counter)
        return _counters[card.key]


def _load_local(card: ModelCard) -> PromptCounter | None:
    args = card.engine_args
    if args.get("trust_remote_code"):
        return None  # the model's own code runs in the engine, not in the UI process
    folder = _folders.get(card.key)
    source = str(folder) if folder is not None else str(args.get("tokenizer") or args.get("model") or "")
    if not source:
        return None
    revision = None if Path(source).is_dir() else args.get("revision", card.revision)
    try:
        from transformers import AutoProcessor, AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(source, revision=revision, local_files_only=True)
        owner = None
        if card.chat_template_owner == "processor":
            owner = ProcessorTemplate(
                AutoProcessor.from_pretrained(source, revision=revision, local_files_only=True)
            )
    except Exception as error:
        log.info("no local tokenizer for %s (%s); the size check estimates", card.key, str(error)[:200])
        return None
    return PromptCounter(card, tokenizer, owner)


class ProcessorTemplate:
    """A processor's chat template with its tokenizer's token ids (what the adapters call)."""

    def __init__(self, processor: Any) -> None:
        self._processor = processor
        self.eos_token_id = getattr(processor.tokenizer, "eos_token_id", None)

    def apply_chat_template(
        self, conversation: Any, tokenize: bool = False, add_generation_prompt: bool = True
    ) -> Any:
        return self._processor.apply_chat_template(
            conversation, tokenize=tokenize, add_generation_prompt=add_generation_prompt
        )

    def convert_tokens_to_ids(self, tokens: str) -> Any:
        return self._processor.tokenizer.convert_tokens_to_ids(tokens)
