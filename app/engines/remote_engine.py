"""A model served by an OpenAI-compatible vLLM server (`vllm serve ...`) on another machine.

A card whose prompt format this app writes itself (`adapter: format`, most of the catalog) sends
the prompt it renders, exactly as a local engine gets it: as a per-request chat template that
prints it (the server needs `--trust-request-chat-template`; without it the server's own
template is used, with a warning). Other cards use the model's own chat template either way, so
the server applies it. The media go as chat message parts: images as PNG data URLs (lossless,
as OCR models need every stroke), videos as the frames this app sampled, in vLLM's `video/jpeg`
data URL, the one frame format it takes, with their timestamps passed as `media_io_kwargs`.
Text that holds a string the server's tokenizer reads as one added token (`<|im_end|>`) goes
with that string broken by a zero-width space, so it stays text (`_literal_texts`).
"""

from __future__ import annotations

import asyncio
import base64
import io
import logging
import os
from collections import OrderedDict
from collections.abc import AsyncIterator, Sequence
from typing import Any

from app.catalog.adapters import PromptError, RenderedPrompt, render, to_turns
from app.catalog.cards import ModelCard
from app.engines.base import (
    EngineError,
    EngineFailure,
    SamplingSettings,
    StreamEnd,
    TextDelta,
    explain_refusal,
)
from app.engines.tokens import broken_apart, lookalikes

log = logging.getLogger(__name__)

CONNECT_TIMEOUT_S = 10.0
# The server is asked about at most this many new strings per message, all at once, within the
# deadline (seconds, before the answer's request), and its answers for this many are remembered.
LOOKALIKES_ASKED, TOKENIZE_DEADLINE_S, ONE_TOKEN_CACHE = 16, 2.0, 4096


class RemoteEngine:
    resident = False
    # A server elsewhere: nothing measured here.
    footprint_bytes = None
    can_sleep = False

    def __init__(self, client: Any, url: str, served_model: str) -> None:
        self._client = client
        self.url = url
        self.served_model = served_model
        self._streams: dict[str, Any] = {}
        self._send_video_metadata = True
        self._send_rendered_prompt = True
        # Whether the server's tokenizer reads a string as one token (`_literal_texts`), the
        # latest used last.
        self._one_token: OrderedDict[str, bool] = OrderedDict()

    @classmethod
    async def connect(cls, url: str, card: ModelCard) -> RemoteEngine:
        """Connects and finds the served model: the card's repository, or the server's only model."""
        from openai import AsyncOpenAI, OpenAIError, Timeout

        client = AsyncOpenAI(
            base_url=url,
            api_key=os.environ.get("APP_REMOTE_API_KEY", "EMPTY"),
            max_retries=0,
            # openai's own Timeout: from 3.63 its client is httpx2's and refuses httpx's.
            timeout=Timeout(600.0, connect=CONNECT_TIMEOUT_S),
        )
        try:
            served = [model.id async for model in client.models.list()]
        except OpenAIError as error:
            await client.close()
            raise EngineError(f"{card.display_name}: cannot reach its server at {url} ({error}).") from None
        if card.hf_repo in served:
            return cls(client, url, card.hf_repo)
        if len(served) == 1:
            return cls(client, url, served[0])
        await client.close()
        raise EngineError(
            f"{card.display_name}: the server at {url} serves {served}, not {card.hf_repo}; "
            "start it with --served-model-name " + card.hf_repo
        )

    def unfinished_requests(self) -> int:
        return len(self._streams)

    async def abort(self, request_id: str) -> None:
        stream = self._streams.get(request_id)
        if stream is not None:
            # Closing the HTTP stream makes the server abort the request.
            await stream.close()

    async def generate(
        self, card: ModelCard, messages: Sequence[dict[str, Any]], sampling: SamplingSettings, request_id: str
    ) -> AsyncIterator[TextDelta | StreamEnd]:
        from openai import APIConnectionError, APIStatusError, BadRequestError

        try:
            stream, chat, rendered = await self._open(card, messages, sampling)
        except BadRequestError as error:
            detail = _message(error)
            log.info("%s's server refused a request: %s", card.key, detail)
            line = explain_refusal(card.display_name, detail)
            raise PromptError(line or f"{card.display_name} cannot take this input: {detail}") from None
        except APIConnectionError:
            raise EngineFailure(
                f"{card.display_name}: lost the connection to its server at {self.url}."
            ) from None
        except APIStatusError as error:
            raise EngineError(
                f"{card.display_name}'s server refused the request: {_message(error)}"
            ) from None
        self._streams[request_id] = stream
        finish_reason, prompt_tokens, completion_tokens = "abort", 0, 0
        try:
            async for chunk in stream:
                if chunk.usage is not None:
                    prompt_tokens, completion_tokens = (
                        chunk.usage.prompt_tokens,
                        chunk.usage.completion_tokens,
                    )
                for choice in chunk.choices:
                    if choice.delta.content:
                        yield TextDelta(choice.delta.content)
                    if choice.finish_reason:
                        finish_reason = choice.finish_reason
            shown = describe_messages(chat) if rendered is None else rendered.prompt
            yield StreamEnd(finish_reason, prompt_tokens, completion_tokens, shown)
        except APIConnectionError:
            raise EngineFailure(
                f"{card.display_name}: lost the connection to its server at {self.url}."
            ) from None
        finally:
            self._streams.pop(request_id, None)
            await stream.close()

    async def _open(
        self, card: ModelCard, messages: Sequence[dict[str, Any]], sampling: SamplingSettings
    ) -> tuple[Any, list[dict[str, Any]], RenderedPrompt | None]:
        """The request's stream, the chat messages sent, and the prompt sent as written (None
        where the server's own template writes it)."""
        messages = await self._literal_texts(messages)
        rendered = locally_rendered(card, messages) if self._send_rendered_prompt else None
        chat, video_kwargs = chat_messages(messages if rendered is None else carrier(messages, rendered))
        try:
            return await self._open_stream(card, chat, video_kwargs, sampling, rendered), chat, rendered
        except RenderedPromptRefused:
            chat, video_kwargs = chat_messages(messages)
            return await self._open_stream(card, chat, video_kwargs, sampling, None), chat, None

    async def _literal_texts(self, messages: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
        """`messages` with each string of their texts that the server's tokenizer reads as one
        added token broken apart (`broken_apart`), so that a visitor's `<|im_end|><|im_start|>`
        stays text, as a local engine keeps it (`app.engines.tokens`). The server says which
        strings are one token (vLLM's `/tokenize`); the answers are remembered. A string not
        asked (past the first few new ones, or past the deadline) is broken apart."""
        found = lookalikes(messages)
        known = self._one_token
        new = sorted(found - known.keys())[:LOOKALIKES_ASKED]
        if new:
            try:
                said = await asyncio.wait_for(
                    asyncio.gather(*(self._is_one_token(string) for string in new)), TOKENIZE_DEADLINE_S
                )
            except TimeoutError:
                said = [None] * len(new)
            for string, one_token in zip(new, said, strict=True):
                if one_token is not None:  # a failed question is asked again next time
                    known[string] = one_token
        for string in found & known.keys():
            known.move_to_end(string)
        while len(known) > ONE_TOKEN_CACHE:
            known.popitem(last=False)
        return broken_apart(messages, {string for string in found if known.get(string, True)})

    async def _is_one_token(self, string: str) -> bool | None:
        """Whether the server's tokenizer reads `string` as one token; None if it cannot say."""
        from openai import OpenAIError

        root = self.url.rstrip("/").removesuffix("/v1")
        try:
            # The body as JSON (a dict): not tied to the HTTP library openai's version uses.
            answer = await self._client.post(
                f"{root}/tokenize",
                cast_to=dict,
                body={"model": self.served_model, "prompt": string, "add_special_tokens": False},
                options={"timeout": TOKENIZE_DEADLINE_S},
            )
            return len(answer["tokens"]) == 1
        except (OpenAIError, ValueError, KeyError, TypeError):
            return None  # a server without vLLM's /tokenize: broken apart, to be safe

    async def _open_stream(
        self,
        card: ModelCard,
        chat: list[dict[str, Any]],
        video_kwargs: dict[str, Any],
        sampling: SamplingSettings,
        rendered: RenderedPrompt | None,
    ) -> Any:
        from openai import BadRequestError

        extra: dict[str, Any] = {"ignore_eos": sampling.ignore_eos}
        if video_kwargs and self._send_video_metadata:
            extra["media_io_kwargs"] = {"video": video_kwargs}
        if rendered is not None:
            extra.update(
                chat_template=PRINTS_RENDERED_PROMPT,
                chat_template_kwargs={"rendered_prompt": rendered.prompt},
                # As vLLM tokenises a local engine's text prompt (a begin-of-text token where
                # the model's processor adds one); chat requests leave them to the template.
                add_special_tokens=card.architecture not in PROMPTS_WITHOUT_SPECIAL_TOKENS,
            )
            if rendered.stop_token_ids:
                extra["stop_token_ids"] = rendered.stop_token_ids
        try:
            return await self._client.chat.completions.create(
                model=self.served_model,
                messages=chat,
                stream=True,
                stream_options={"include_usage": True},
                temperature=sampling.temperature,
                top_p=sampling.top_p,
                max_tokens=sampling.max_tokens,
                seed=sampling.seed,
                extra_body=extra,
            )
        except BadRequestError as error:
            if rendered is not None and "trust-request-chat-template" in str(error):
                # The card's prompt cannot go as written: the server's own template instead.
                log.warning(
                    "%s refuses a per-request chat template; its own template is used, so prompts "
                    "may differ from a local engine's (start it with --trust-request-chat-template)",
                    self.url,
                )
                self._send_rendered_prompt = False
                raise RenderedPromptRefused from None
            if "media_io_kwargs" not in extra or "media_io_kwargs" not in str(error):
                raise
            # A server started without --trust-request-mm-kwargs refuses the frames' timestamps;
            # the frames still go, with vLLM's default timing.
            log.warning("%s refuses per-request video metadata; sending frames without it", self.url)
            self._send_video_metadata = False
            return await self._open_stream(card, chat, video_kwargs, sampling, rendered)

    async def sleep(self) -> None:
        raise EngineError("a remote server cannot be put to sleep from here")

    async def wake(self) -> None:
        raise EngineError("a remote server cannot be woken from here")

    async def shutdown(self) -> None:
        await self._client.close()


# A per-request chat template that prints the prompt this app rendered, passed as a variable (so
# nothing a user wrote is ever read as template code).
PRINTS_RENDERED_PROMPT = "{{ rendered_prompt }}"


# Format cards whose vLLM processor tokenises a text prompt without special tokens (their
# `get_default_tok_params`); every other multimodal model gets them. Checked against the
# installed vLLM by tests/test_remote_engine.py.
PROMPTS_WITHOUT_SPECIAL_TOKENS = frozenset({"Ovis2_5", "PaliGemmaForConditionalGeneration"})


class RenderedPromptRefused(Exception):
    """The server takes no per-request chat template (no --trust-request-chat-template)."""


def locally_rendered(card: ModelCard, messages: Sequence[dict[str, Any]]) -> RenderedPrompt | None:
    """The prompt a local engine gets, where this app writes it without the model's tokenizer (a
    format card); None where the model's own chat template writes it, which the server has."""
    if card.adapter != "format":
        return None
    several_via_template = getattr(card.prompt_spec, "several_images_via_chat_template", False)
    if several_via_template and any(len(turn.images) > 1 for turn in to_turns(messages)):
        return None
    return render(card, messages)


def carrier(messages: Sequence[dict[str, Any]], rendered: RenderedPrompt) -> Sequence[dict[str, Any]]:
    """The messages that go with a rendered prompt: the server takes the media from them and the
    text from the template. The conversation itself where the prompt holds all its media (so a
    server whose tokenizer ignores chat templates, as vLLM's Mistral mode does, still reads the
    whole chat), else the prompt's media with the latest message's text (a single-turn format)."""
    turns = to_turns(messages)
    every = [id(item) for turn in turns for item in (*turn.images, *turn.videos)]
    if every == [id(item) for item in (*rendered.images, *rendered.videos)] or not every:
        return messages
    parts = [{"type": "image", "image": image} for image in rendered.images]
    parts += [{"type": "video", "video": video} for video in rendered.videos]
    return [{"role": "user", "content": [*parts, {"type": "text", "text": turns[-1].text}]}]


def chat_messages(messages: Sequence[dict[str, Any]]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The conversation as OpenAI chat messages, plus the sampled video's metadata for vLLM."""
    chat: list[dict[str, Any]] = []
    video_kwargs: dict[str, Any] = {}
    for turn in to_turns(messages):
        if not turn.images and not turn.videos:
            chat.append({"role": turn.role, "content": turn.text})
            continue
        parts: list[dict[str, Any]] = []
        for image in turn.images:
            parts.append({"type": "image_url", "image_url": {"url": _png_data_url(image)}})
        for video in turn.videos:
            frames, metadata = (video[0], video[1]) if isinstance(video, tuple) else (video, {})
            encoded = ",".join(_jpeg_base64(frame) for frame in frames)
            parts.append({"type": "video_url", "video_url": {"url": f"data:video/jpeg;base64,{encoded}"}})
            video_kwargs = {
                key: metadata[key] for key in ("fps", "duration", "total_num_frames") if key in metadata
            }
            if "frames_indices" in metadata:
                video_kwargs["frames_indices"] = [int(i) for i in metadata["frames_indices"]]
        parts.append({"type": "text", "text": turn.text})
        chat.append({"role": turn.role, "content": parts})
    return chat, video_kwargs


def describe_messages(chat: list[dict[str, Any]]) -> str:
    """The chat messages as text for exports, with media shown as placeholders."""
    lines = []
    for message in chat:
        content = message["content"]
        if isinstance(content, list):
            content = "".join(
                part["text"] if part["type"] == "text" else f"<{part['type'].removesuffix('_url')}>"
                for part in content
            )
        lines.append(f"{message['role']}: {content}")
    return "\n".join(lines)


def _jpeg_base64(image: Any) -> str:
    from PIL import Image

    if not isinstance(image, Image.Image):
        image = Image.fromarray(image)
    buffer = io.BytesIO()
    image.convert("RGB").save(buffer, format="JPEG", quality=92)
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def _png_data_url(image: Any) -> str:
    """A picture as the server gets it: PNG, so that it reaches the model pixel for pixel (the
    JPEG at quality 92 sent before blurred small print)."""
    buffer = io.BytesIO()
    image.save(buffer, format="PNG", compress_level=1)  # fast; size matters less than time here
    return f"data:image/png;base64,{base64.b64encode(buffer.getvalue()).decode('ascii')}"


def _message(error: Any) -> str:
    body = getattr(error, "body", None)
    if isinstance(body, dict):
        detail = body.get("message") or body.get("error", {})
        if isinstance(detail, dict):
            detail = detail.get("message")
        if detail:
            return str(detail).splitlines()[0][:300]
    return str(error).splitlines()[0][:300]
