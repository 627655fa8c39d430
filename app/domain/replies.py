"""One model's answer to one prompt, streamed from the engine manager and measured: what the chat
labels each answer with and what a compare column holds. The one place that reads the
manager's stream for the views, so chat and compare measure the same way.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from app.catalog.cards import ModelCard
from app.engines.base import ModelState, ModelStatus, SamplingSettings, StreamEnd
from app.engines.manager import EngineManager
from app.storage.history import REPLY_FIELDS, ReplyRecord

log = logging.getLogger(__name__)

Piece = TypeVar("Piece")
# How often a view waiting for the next piece of an answer looks at its Stop.
STOP_CHECK_S = 0.2
# States that say the answer is over.
ENDED = {"done", "stopped", "failed"}
# Why an answer ended early, as shown with it.
ENDINGS = {"length": "cut at the token limit", "abort": "stopped"}


@dataclass
class Reply:
    """One model's answer and how it went. `source` is where the model comes from, as users are
    told (`ModelCard.source`: never a folder on the server)."""

    key: str
    display_name: str
    source: str
    state: str = "waiting"
    answer: str = ""
    error: str = ""
    finish_reason: str = ""
    prompt: str = ""
    prompt_tokens: int = 0
    completion_tokens: int = 0
    load_s: float | None = None
    ttft_s: float | None = None
    tokens_per_s: float | None = None
    # What was sent with the prompt, as users are told: the media with their sizes, and sampling.
    media: list[str] = field(default_factory=list)
    sampling: dict[str, Any] = field(default_factory=dict)
    # The boxes the answer names, drawn on the picture it is about (cards that ground).
    boxes_drawn: Path | None = None
    box_count: int = 0

    @classmethod
    def of(cls, card: ModelCard, **details: Any) -> Reply:
        return cls(card.key, card.display_name, card.source, **details)

    @property
    def ended(self) -> bool:
        return self.state in ENDED

    @property
    def ending(self) -> str:
        """Why the answer ended early ("stopped", "cut at the token limit"); empty otherwise."""
        return "stopped" if self.state == "stopped" else ENDINGS.get(self.finish_reason, "")

    def header(self) -> str:
        """How it went, in a line: state, first token, speed, load time."""
        facts = [self.state]
        if self.ttft_s is not None:
            facts.append(f"first token {self.ttft_s:.2f} s")
        if self.tokens_per_s is not None:
            facts.append(f"{self.tokens_per_s:.1f} tok/s")
        if self.load_s is not None:
            facts.append(f"loaded in {self.load_s:.0f} s")
        return " · ".join(facts)

    def label(self) -> str:
        """The line under a chat answer: who wrote it and how fast."""
        facts = [self.display_name]
        if self.ttft_s is not None:
            facts.append(f"first token {self.ttft_s:.2f} s")
        if self.completion_tokens:
            facts.append(f"{self.completion_tokens} tokens")
        if self.tokens_per_s is not None:
            facts.append(f"{self.tokens_per_s:.1f} tok/s")
        if self.ending:
            facts.append(self.ending)
        return " · ".join(facts)


def describe_sampling(sampling: SamplingSettings) -> dict[str, Any]:
    """Sampling settings as users are told them (with every value filled, `for_card`)."""
    return {
        "temperature": sampling.temperature,
        "top_p": sampling.top_p,
        "max_tokens": sampling.max_tokens,
        "seed": "random" if sampling.seed is None else sampling.seed,
    }


async def stream_reply(
    manager: EngineManager,
    card: ModelCard,
    messages: Any,
    sampling: SamplingSettings,
    reply: Reply,
    clock: Callable[[], float] = time.monotonic,
) -> AsyncIterator[Reply]:
    """Streams `card`'s answer into `reply`, yielding it after every change. Time to first token
    counts from when the model was ready (its load is `load_s`). Closing the generator aborts
    the request in the engine and marks the reply stopped."""
    started = clock()
    ready_at = started
    first_token_at: float | None = None
    reply.state = "starting"
    reply.sampling = describe_sampling(sampling.for_card(card))
    try:
        async with contextlib.aclosing(manager.stream(card.key, messages, sampling)) as events:
            async for event in events:
                now = clock()
                if isinstance(event, ModelStatus):
                    reply.state = event.describe()
                    if event.state is ModelState.READY:
                        ready_at = now
                        reply.load_s = now - started
                elif isinstance(event, StreamEnd):
                    reply.state = "done" if event.finish_reason != "abort" else "stopped"
                    reply.finish_reason = event.finish_reason
                    reply.prompt = event.prompt
                    reply.prompt_tokens = event.prompt_tokens
                    reply.completion_tokens = event.completion_tokens
                    if first_token_at is None and event.completion_tokens:
                        # The whole answer came with its end (a short one, under load): its first
                        # token was there by now at the latest.
                        first_token_at = now
                        reply.ttft_s = now - ready_at
                    if first_token_at is not None and event.completion_tokens > 1 and now > first_token_at:
                        reply.tokens_per_s = (event.completion_tokens - 1) / (now - first_token_at)
                else:
                    if first_token_at is None:
                        first_token_at = now
                        reply.ttft_s = now - ready_at
                        reply.state = "answering"
                    reply.answer += event.text
                yield reply
    finally:
        # Stopped before it ended: a reply left "loading" or "answering" would say it still is.
        if not reply.ended:
            reply.state = "stopped"


def reply_record(reply: Reply, **changes: Any) -> ReplyRecord:
    """An answer as the history stores it (`changes` replace some of its fields)."""
    return ReplyRecord(model=reply.key, **{name: getattr(reply, name) for name in REPLY_FIELDS} | changes)


def stored_reply(stored: ReplyRecord, source: str, **details: Any) -> Reply:
    """A stored answer back in the views' shape; `source` is where its model comes from, as
    users are told, and `details` set the fields the record does not keep (or replace some)."""
    fields = {name: getattr(stored, name) for name in REPLY_FIELDS}
    fields["display_name"] = stored.display_name or stored.model
    return Reply(key=stored.model, source=source, **fields | details)


async def until_stopped(
    stream: AsyncIterator[Piece], stopped: Callable[[], bool], every_s: float = STOP_CHECK_S
) -> AsyncIterator[Piece]:
    """`stream`'s pieces until it ends or `stopped()` is true, looked at after each piece and every
    `every_s` while the next is awaited: a Stop pressed while the engine hands on nothing (a long
    first token, a video's prefill, a busy engine) takes at once, not at the next piece. Stopped
    mid-wait, the wait is cancelled inside `stream`, which ends it as closing it would (a reply
    stream then aborts its request in the engine)."""

    async def next_piece() -> tuple[bool, Any]:
        try:
            return True, await anext(stream)
        except StopAsyncIteration:  # (raised out of a task, it would read as an error)
            return False, None

    waiting: asyncio.Task[tuple[bool, Any]] | None = None
    try:
        while not stopped():
            waiting = waiting or asyncio.create_task(next_piece())
            done, _ = await asyncio.wait({waiting}, timeout=every_s)
            if not done:
                continue
            more, piece = waiting.result()
            waiting = None
            if not more:
                return
            yield piece
    finally:
        if waiting is not None:
            waiting.cancel()
            try:
                await waiting
            except asyncio.CancelledError:
                # The wait's own cancellation ends here; one aimed at this task (a closed tab
                # while the stop's abort runs) goes on.
                current = asyncio.current_task()
                if current is not None and current.cancelling():
                    raise
            except Exception:  # the stop stands, and a cancellation under way is not replaced
                log.warning("an answer's stream failed as it was stopped", exc_info=True)
