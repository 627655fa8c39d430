"""One input answered by several models, streamed side by side, and exported.

Every model's request goes to the engine manager at once, in column order; its scheduler lets
models that fit in memory together answer at once and the others in turn (first column first),
and each waiting column shows what it waits for. Remote engines never wait for local ones.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any

from app.cards import ModelCard
from app.conversation import user_message
from app.engine import EngineManager, ModelState, ModelStatus, SamplingSettings, StreamEnd

MIN_MODELS, MAX_MODELS = 2, 4
# Column states that say the answer is over.
ENDED = {"done", "stopped", "failed"}


@dataclass
class Column:
    """One model's answer and how it went."""

    key: str
    display_name: str
    hf_repo: str
    revision: str | None
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

    def header(self) -> str:
        facts = [self.state]
        if self.ttft_s is not None:
            facts.append(f"first token {self.ttft_s:.2f} s")
        if self.tokens_per_s is not None:
            facts.append(f"{self.tokens_per_s:.1f} tok/s")
        if self.load_s is not None:
            facts.append(f"loaded in {self.load_s:.0f} s")
        return " · ".join(facts)


@dataclass
class Comparison:
    text: str
    files: list[str]
    system: str
    sampling: SamplingSettings
    columns: list[Column] = field(default_factory=list)
    started: str = field(default_factory=lambda: datetime.now(UTC).isoformat(timespec="seconds"))


async def run(
    manager: EngineManager,
    comparison: Comparison,
    cards: Sequence[ModelCard],
    messages_for: Callable[[ModelCard], Any],
    clock: Callable[[], float] = time.monotonic,
    refresh_s: float = 0.2,
) -> AsyncIterator[Comparison]:
    """Streams every model's answer into `comparison.columns`, yielding it as it changes.
    `messages_for(card)` is awaited for each model's conversation (frames differ per model).
    Closing the generator stops every answer in its engine."""
    comparison.columns = [Column(c.key, c.display_name, c.hf_repo, c.revision) for c in cards]
    columns = {column.key: column for column in comparison.columns}
    changed = asyncio.Event()

    async def answer(card: ModelCard) -> None:
        column = columns[card.key]
        try:
            messages = await messages_for(card)
            column.state = "starting"
            changed.set()
            await _stream(manager, card, messages, comparison.sampling, column, changed, clock)
        except Exception as error:
            column.state, column.error = "failed", user_message(error)
        changed.set()

    tasks = []
    for card in cards:
        tasks.append(asyncio.create_task(answer(card)))
        # Each request joins the scheduler's line before the next: columns keep their order.
        await asyncio.sleep(0)
    try:
        while not all(task.done() for task in tasks):
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(changed.wait(), timeout=refresh_s)
            changed.clear()
            yield comparison
        yield comparison
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        # Stopped before they ended: a column left "loading" or "waiting" would say it still is.
        for column in comparison.columns:
            if column.state not in ENDED:
                column.state = "stopped"


async def _stream(
    manager: EngineManager,
    card: ModelCard,
    messages: Any,
    sampling: SamplingSettings,
    column: Column,
    changed: asyncio.Event,
    clock: Callable[[], float],
) -> None:
    started = clock()
    ready_at = started
    first_token_at: float | None = None
    async with contextlib.aclosing(manager.stream(card.key, messages, sampling)) as events:
        async for event in events:
            now = clock()
            if isinstance(event, ModelStatus):
                column.state = event.describe()
                if event.state is ModelState.READY:
                    ready_at = now
                    column.load_s = now - started
            elif isinstance(event, StreamEnd):
                column.state = "done" if event.finish_reason != "abort" else "stopped"
                column.finish_reason = event.finish_reason
                column.prompt = event.prompt
                column.prompt_tokens = event.prompt_tokens
                column.completion_tokens = event.completion_tokens
                if first_token_at is not None and event.completion_tokens > 1 and now > first_token_at:
                    column.tokens_per_s = (event.completion_tokens - 1) / (now - first_token_at)
            else:
                if first_token_at is None:
                    first_token_at = now
                    column.ttft_s = now - ready_at
                    column.state = "answering"
                column.answer += event.text
            changed.set()


def to_json(comparison: Comparison) -> str:
    return json.dumps(asdict(comparison), indent=2, ensure_ascii=False)


def to_markdown(comparison: Comparison) -> str:
    s = comparison.sampling
    seed = "random" if s.seed is None else s.seed
    lines = [
        f"# Comparison of {len(comparison.columns)} models",
        "",
        f"- Started: {comparison.started}",
        f"- Files: {', '.join(comparison.files) or 'none'}",
        f"- Sampling: temperature {s.temperature}, top-p {s.top_p}, max tokens {s.max_tokens}, seed {seed}",
        "",
        "System prompt:",
        "",
        *(_fenced(comparison.system) if comparison.system else ["(none)"]),
        "",
        "Input:",
        "",
        *_fenced(comparison.text),
    ]
    for column in comparison.columns:
        lines += [
            "",
            f"## {column.display_name}",
            "",
            f"- Repository: {column.hf_repo} (revision {column.revision or 'default branch'})",
            f"- State: {column.state}" + (f": {column.error}" if column.error else ""),
            f"- Time to first token: {_seconds(column.ttft_s)}; tokens per second: "
            f"{_rate(column.tokens_per_s)}; load: {_seconds(column.load_s)}",
            f"- Tokens: {column.prompt_tokens} in the prompt, {column.completion_tokens} in the answer "
            f"(finish reason: {column.finish_reason or 'none'})",
            "",
            "Prompt:",
            "",
            *_fenced(column.prompt),
            "",
            "Answer:",
            "",
            *(_fenced(column.answer) if column.answer else ["(none)"]),
        ]
    return "\n".join(lines) + "\n"


def _fenced(text: str) -> list[str]:
    """`text` verbatim in a code block whose fence no backtick run inside it can close."""
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    fence = "`" * max(3, longest + 1)
    return [f"{fence}text", text, fence]


def export_name(comparison: Comparison) -> str:
    """A file name per comparison (not one `comparison.json` for all): when it started, and
    the models' keys."""
    when = re.sub(r"[^0-9T]", "", comparison.started.split("+")[0])
    keys = "-".join(re.sub(r"[^A-Za-z0-9_.]", "", column.key) for column in comparison.columns)
    return f"comparison-{when}-{keys}"[:120]


def _seconds(value: float | None) -> str:
    return f"{value:.2f} s" if value is not None else "n/a"


def _rate(value: float | None) -> str:
    return f"{value:.1f}" if value is not None else "n/a"


def remote_keys(cards: Mapping[str, ModelCard], remote_engines: Mapping[str, str]) -> set[str]:
    return {key for key, card in cards.items() if card.remote_url or key in remote_engines}
