"""A model served by an OpenAI-compatible vLLM server (`vllm serve ...`) on another machine.

The server applies the model's own chat template, so the conversation goes as chat messages
with image parts (PNG data URLs: lossless, as OCR models need every stroke) and video parts (the
frames this app sampled, as vLLM's `video/jpeg` data URL, the one frame format it takes, with
their timestamps passed as `media_io_kwargs`).
"""

from __future__ import annotations

import base64
import io
import logging
import os
from collections.abc import AsyncIterator, Sequence
from typing import Any

from app.catalog.adapters import PromptError, to_turns
from app.catalog.cards import ModelCard
from app.engines.base import (
    EngineError,
    EngineFailure,
    SamplingSettings,
    StreamEnd,
    TextDelta,
    explain_refusal,
)

log = logging.getLogger(__name__)

CONNECT_TIMEOUT_S = 10.0


class RemoteEngine:
    resident = False
    can_sleep = False

    def __init__(self, client: Any, url: str, served_model: str) -> None:
        self._client = client
        self.url = url
        self.served_model = served_model
        self._streams: dict[str, Any] = {}
        self._send_video_metadata = True

    @classmethod
    async def connect(cls, url: str, card: ModelCard) -> RemoteEngine:
        """Connects and finds the served model: the card's repository, or the server's only model."""
        import httpx
        from openai import AsyncOpenAI, OpenAIError

        client = AsyncOpenAI(
            base_url=url,
            api_key=os.environ.get("APP_REMOTE_API_KEY", "EMPTY"),
            max_retries=0,
            timeout=httpx.Timeout(600.0, connect=CONNECT_TIMEOUT_S),
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

        chat, video_kwargs = chat_messages(messages)
        try:
            stream = await self._open_stream(chat, video_kwargs, sampling)
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
            yield StreamEnd(finish_reason, prompt_tokens, completion_tokens, describe_messages(chat))
        except APIConnectionError:
            raise EngineFailure(
                f"{card.display_name}: lost the connection to its server at {self.url}."
            ) from None
        finally:
            self._streams.pop(request_id, None)
            await stream.close()

    async def _open_stream(
        self, chat: list[dict[str, Any]], video_kwargs: dict[str, Any], sampling: SamplingSettings
    ) -> Any:
        from openai import BadRequestError

        extra: dict[str, Any] = {"ignore_eos": sampling.ignore_eos}
        if video_kwargs and self._send_video_metadata:
            extra["media_io_kwargs"] = {"video": video_kwargs}
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
            if "media_io_kwargs" not in extra or "media_io_kwargs" not in str(error):
                raise
            # A server started without --trust-request-mm-kwargs refuses the frames' timestamps;
            # the frames still go, with vLLM's default timing.
            log.warning("%s refuses per-request video metadata; sending frames without it", self.url)
            self._send_video_metadata = False
            return await self._open_stream(chat, video_kwargs, sampling)

    async def sleep(self) -> None:
        raise EngineError("a remote server cannot be put to sleep from here")

    async def wake(self) -> None:
        raise EngineError("a remote server cannot be woken from here")

    async def shutdown(self) -> None:
        await self._client.close()


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
