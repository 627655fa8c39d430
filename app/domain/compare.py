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

from app.catalog.cards import ModelCard
from app.domain.conversation import user_message
from app.domain.replies import Reply, stream_reply
from app.engines.base import SamplingSettings
from app.engines.manager import EngineManager

MIN_MODELS, MAX_MODELS = 2, 4
# A column is one model's reply to the shared input.
Column = Reply


@dataclass
class Comparison:
    text: str
    files: list[str]
    system: str
    sampling: SamplingSettings
    columns: list[Reply] = field(default_factory=list)
    started: str = field(default_factory=lambda: datetime.now(UTC).isoformat(timespec="seconds"))


async def run(
    manager: EngineManager,
    comparison: Comparison,
    cards: Sequence[ModelCard],
    messages_for: Callable[[ModelCard], Any],
    clock: Callable[[], float] = time.monotonic,
    refresh_s: float = 0.2,
    media: Sequence[str] = (),
) -> AsyncIterator[Comparison]:
    """Streams every model's answer into `comparison.columns`, yielding it as it changes.
    `messages_for(card)` is awaited for each model's conversation (frames differ per model);
    `media` describes the files sent, for every column. Closing the generator stops every
    answer in its engine."""
    comparison.columns = [Reply.of(card, media=list(media)) for card in cards]
    columns = {column.key: column for column in comparison.columns}
    changed = asyncio.Event()

    async def answer(card: ModelCard, messages: Any) -> None:
        column = columns[card.key]
        try:
            if isinstance(messages, BaseException):
                raise messages
            async for _ in stream_reply(manager, card, messages, comparison.sampling, column, clock):
                changed.set()
        except Exception as error:
            column.state, column.error = "failed", user_message(error)
        changed.set()

    # Every conversation is made before any request goes: a prompt is counted in a thread, so a
    # later column's could be ready first and join the scheduler's line first (under load the
    # second column answered first, and the first waited behind it).
    prepared = await asyncio.gather(*(messages_for(card) for card in cards), return_exceptions=True)
    tasks = []
    for card, messages in zip(cards, prepared, strict=True):
        tasks.append(asyncio.create_task(answer(card, messages)))
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
        # Stopped before they started: a column left "waiting" would say it still is.
        for column in comparison.columns:
            if not column.ended:
                column.state = "stopped"


def to_json(comparison: Comparison) -> str:
    document = asdict(comparison)
    for column in document["columns"]:
        # A drawing of the answer's boxes is a file on this server: not for the export.
        column.pop("boxes_drawn", None)
    return json.dumps(document, indent=2, ensure_ascii=False)


def own(value: Any) -> Any:
    """A sampling value, or what it is where each model takes its own."""
    return "each model's own" if value is None else value


def to_markdown(comparison: Comparison) -> str:
    s = comparison.sampling
    seed = "random" if s.seed is None else s.seed
    lines = [
        f"# Comparison of {len(comparison.columns)} models",
        "",
        f"- Started: {comparison.started}",
        f"- Files: {', '.join(comparison.files) or 'none'}",
        f"- Sampling: temperature {own(s.temperature)}, top-p {own(s.top_p)}, max tokens "
        f"{own(s.max_tokens)}, seed {seed}",
        "",
        "System prompt:",
        "",
        *(fenced(comparison.system) if comparison.system else ["(none)"]),
        "",
        "Input:",
        "",
        *fenced(comparison.text),
    ]
    for column in comparison.columns:
        lines += [
            "",
            f"## {column.display_name}",
            "",
            f"- Model: {column.source}",
            f"- State: {column.state}" + (f": {column.error}" if column.error else ""),
            f"- Time to first token: {_seconds(column.ttft_s)}; tokens per second: "
            f"{_rate(column.tokens_per_s)}; load: {_seconds(column.load_s)}",
            f"- Tokens: {column.prompt_tokens} in the prompt, {column.completion_tokens} in the answer "
            f"(finish reason: {column.finish_reason or 'none'})",
            "",
            "Prompt:",
            "",
            *fenced(column.prompt),
            "",
            "Answer:",
            "",
            *(fenced(column.answer) if column.answer else ["(none)"]),
        ]
    return "\n".join(lines) + "\n"


def fenced(text: str) -> list[str]:
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
