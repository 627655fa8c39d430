"""A prompt set run across several models into a grid: items as rows, models as columns.

The run goes model by model (every item on one model before the next is loaded), models already
in memory first, so a set of N items on M models costs at most M loads, not N x M swaps. Each
model's items go to its engine a few at a time (vLLM batches them). A run gives way to everyone
else: before each item it waits while any request for another model waits in the scheduler's
line (a chat user who picked another model is served first, at the cost of a swap).

A cell is a `Reply` (the chat's answer type): its text, time to first token and tokens per
second. A stopped run keeps its finished cells; resuming runs only the others. The run is stored
in the history as a conversation of kind "grid" (one turn per item) and exported as CSV, JSON
and a self-contained HTML report.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import html
import io
import json
import shutil
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from PIL import Image

from app.catalog.cards import ModelCard
from app.domain.conversation import (
    SESSION_FOLDER_PREFIX,
    Turn,
    check_fits,
    engine_messages,
    is_video,
    user_message,
)
from app.domain.exports import csv_text
from app.domain.promptsets import Checked, PromptItem, PromptSet
from app.domain.replies import Reply, reply_record, stored_reply, stream_reply
from app.engines.base import SamplingSettings
from app.engines.manager import EngineManager
from app.media.grounding import draw_answer_boxes
from app.media.loading import VideoDecoderPool, load_image
from app.storage.history import (
    ConversationRecord,
    MediaRecord,
    TurnRecord,
    describe_media,
    new_id,
)

MIN_MODELS, MAX_MODELS = 2, 8
# Items sent to one model's engine at once: enough for vLLM to batch, few enough that a chat
# user's request for the same model is not queued behind a whole set.
BATCH = 4
THUMBNAIL_SIDE = 160
GIVE_WAY_POLL_S = 0.25


@dataclass
class GridRun:
    set_name: str
    items: list[PromptItem]
    models: list[str]  # card keys, in the grid's column order
    names: dict[str, str]  # key -> display name
    sampling: SamplingSettings
    id: str = field(default_factory=new_id)
    # item id -> model key -> its answer
    cells: dict[str, dict[str, Reply]] = field(default_factory=dict)
    started: str = field(default_factory=lambda: datetime.now(UTC).isoformat(timespec="seconds"))
    current: str = ""  # the model answering now
    eta_s: float | None = None

    def cell(self, item_id: str, key: str) -> Reply | None:
        return self.cells.get(item_id, {}).get(key)

    @property
    def total(self) -> int:
        return len(self.items) * len(self.models)

    @property
    def done(self) -> int:
        """Cells with an outcome: answered, or refused up front."""
        return sum(reply.state in ("done", "failed") for row in self.cells.values() for reply in row.values())

    def summary(self) -> str:
        """Cells answered of all, and those that have an outcome without an answer (refused up
        front or failed): "12 of 12" would claim an answer a refused cell never got."""
        states = [reply.state for row in self.cells.values() for reply in row.values()]
        line = f"{states.count('done')} of {self.total} answers"
        if unanswered := states.count("failed"):
            line += f", {unanswered} refused or failed"
        return line

    def progress(self) -> str:
        """A line for the progress bar: cells answered, the model answering, the time left."""
        line = self.summary()
        if self.current:
            line += f" · now: {self.names.get(self.current, self.current)}"
        if self.eta_s is not None and self.done < self.total:
            line += f" · about {describe_seconds(self.eta_s)} left"
        return line


def describe_seconds(seconds: float) -> str:
    if seconds < 90:
        return f"{max(1, round(seconds))} s"
    return f"{round(seconds / 60)} min"


def run_order(models: Sequence[str], resident: Sequence[str]) -> list[str]:
    """Models already in memory first (no load), then the others in the order given."""
    return [key for key in models if key in resident] + [key for key in models if key not in resident]


async def give_way(manager: EngineManager, key: str) -> None:
    """Waits while requests for other models wait in the scheduler's line."""
    while manager.waiting_models() - {key}:
        await asyncio.sleep(GIVE_WAY_POLL_S)


async def run_grid(
    run: GridRun,
    prompt_set: PromptSet,
    cards: Mapping[str, ModelCard],
    checked: Checked,
    manager: EngineManager,
    decoder: VideoDecoderPool,
    clock: Callable[[], float] = time.monotonic,
    refresh_s: float = 0.25,
    batch: int = BATCH,
    *,
    boxes: Path,
) -> AsyncIterator[GridRun]:
    """Fills `run.cells`, yielding the run as it changes. Cells already done (a resumed run) are
    kept. Closing the generator stops every answer in its engine; unfinished cells are then
    marked stopped, and a later run of the same `GridRun` answers them. Boxes that answers name
    are drawn into `boxes`, a folder the caller owns and deletes."""
    changed = asyncio.Event()
    started = clock()
    answered = 0  # cells answered by this call (the rate for the time left)
    for item in run.items:
        row = run.cells.setdefault(item.id, {})
        for key in run.models:
            reason = checked.refused_cells.get((item.id, key))
            if reason is not None:
                row[key] = Reply.of(cards[key], state="failed", error=reason)
            elif key not in row or row[key].state != "done":
                row[key] = Reply.of(cards[key])

    def update_eta() -> None:
        remaining = run.total - run.done
        run.eta_s = (clock() - started) / answered * remaining if answered else None

    async def answer(item: PromptItem, card: ModelCard, limit: asyncio.Semaphore) -> None:
        nonlocal answered
        reply = run.cells[item.id][card.key]
        async with limit:
            await give_way(manager, card.key)
            try:
                files = [prompt_set.path(name) for name in item.media]
                turn = Turn(
                    text=item.question,
                    images=[f for f in files if not is_video(f)],
                    video=next((f for f in files if is_video(f)), None),
                )
                messages = await engine_messages([turn], None, decoder, card.video_frames)
                await asyncio.to_thread(check_fits, card, messages)
                async for _ in stream_reply(manager, card, messages, run.sampling, reply, clock):
                    changed.set()
                if reply.state == "done" and turn.images and card.grounding is not None:
                    out = boxes / f"{run.items.index(item):04d}-{run.models.index(card.key)}.png"
                    count = await asyncio.to_thread(
                        draw_answer_boxes, card, reply.answer, turn.images[-1], out
                    )
                    reply.boxes_drawn, reply.box_count = (out, count) if count else (None, 0)
            except Exception as error:
                reply.state, reply.error = "failed", user_message(error)
        answered += 1
        update_eta()
        changed.set()

    todo = {
        key: [i for i in run.items if run.cells[i.id][key].state not in ("done", "failed")]
        for key in run.models
    }
    try:
        for key in run_order(
            run.models, [k for k, (_, _, asleep) in manager.engines().items() if not asleep]
        ):
            if not todo[key]:
                continue
            run.current = key
            limit = asyncio.Semaphore(batch)
            tasks = [asyncio.create_task(answer(item, cards[key], limit)) for item in todo[key]]
            try:
                while not all(task.done() for task in tasks):
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(changed.wait(), timeout=refresh_s)
                    changed.clear()
                    yield run
            finally:
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
        run.current = ""
        run.eta_s = None
        yield run
    finally:
        run.current = ""
        for row in run.cells.values():
            for reply in row.values():
                if not reply.ended:
                    reply.state = "stopped"


def matches(expected: str, answer: str) -> bool | None:
    """Whether `answer` contains the expected answer (case and spacing aside); None: none given."""
    if not expected.strip():
        return None
    return " ".join(expected.lower().split()) in " ".join(answer.lower().split())


# --- stored in the history ---------------------------------------------------------------------


def to_record(run: GridRun, media: Mapping[str, MediaRecord]) -> ConversationRecord:
    """The run as a conversation of kind "grid": one turn per item, one reply per model (in
    column order). `media` describes each file name of the set (`app.storage.history.describe_media`)."""
    turns = []
    for item in run.items:
        replies = []
        for key in run.models:
            reply = run.cell(item.id, key) or Reply(key, run.names.get(key, key), "")
            # A cell refused or failed keeps its reason where the answer would be.
            replies.append(reply_record(reply, answer=reply.answer or reply.error))
        turns.append(
            TurnRecord(
                text=item.question,
                item_id=item.id,
                expected=item.expected,
                media=[media[name] for name in item.media if name in media],
                replies=replies,
            )
        )
    return ConversationRecord(
        id=run.id, kind="grid", title=f"Grid: {run.set_name}"[:200], model=",".join(run.models), turns=turns
    )


def media_records(prompt_set: PromptSet, checked: Checked) -> tuple[dict[str, MediaRecord], dict[str, Path]]:
    """The files of the set's items whose files `checked` passed, as the history records them
    (name -> record), and the files by hash (for `History.save` to keep). Files that are not
    there are left out, and so are a refused item's: the history keeps its files for weeks, and
    a file the media pipeline refused (a picture of 80 megapixels) is not the server's to keep."""
    passed = {item for items in checked.runnable.values() for item in items}
    passed |= {item for item, _ in checked.refused_cells}
    records, files = {}, {}
    for name in dict.fromkeys(n for item in prompt_set.items if item.id in passed for n in item.media):
        path = prompt_set.path(name)
        if path.is_file():
            record = describe_media(path, name, "video" if is_video(path) else "image", "")
            records[name], files[record.hash] = record, path
    return records, files


def from_record(
    record: ConversationRecord, cards: Mapping[str, ModelCard], sampling: SamplingSettings
) -> GridRun:
    """A stored run, to show again or resume (cells not done are answered again)."""
    models = [key for key in record.model.split(",") if key]
    names = {key: cards[key].display_name if key in cards else key for key in models}
    items = [
        PromptItem(
            id=t.item_id or f"item-{i}", question=t.text, media=[m.name for m in t.media], expected=t.expected
        )
        for i, t in enumerate(record.turns, 1)
    ]
    run = GridRun(record.title.removeprefix("Grid: "), items, models, names, sampling, id=record.id)
    for item, turn in zip(items, record.turns, strict=True):
        for stored in turn.replies:
            source = cards[stored.model].source if stored.model in cards else stored.model
            reason = {"answer": "", "error": stored.answer} if stored.state == "failed" else {}
            run.cells.setdefault(item.id, {})[stored.model] = stored_reply(stored, source, **reason)
    return run


# --- exports -------------------------------------------------------------------------------------

CSV_COLUMNS = [
    "item",
    "question",
    "media",
    "expected",
    "model",
    "name",
    "state",
    "answer",
    "matches_expected",
    "ttft_s",
    "tokens_per_s",
    "prompt_tokens",
    "completion_tokens",
]


def rows(run: GridRun) -> list[dict[str, Any]]:
    """One row per cell, items in order, models in column order."""
    out = []
    for item in run.items:
        for key in run.models:
            reply = run.cell(item.id, key)
            answer = reply.answer if reply else ""
            answered = reply is not None and reply.state == "done"
            out.append(
                {
                    "item": item.id,
                    "question": item.question,
                    "media": ";".join(item.media),
                    "expected": item.expected,
                    "model": key,
                    "name": run.names.get(key, key),
                    "state": reply.state if reply else "waiting",
                    "answer": answer if answer or reply is None else reply.error,
                    "matches_expected": matches(item.expected, answer) if answered else None,
                    "ttft_s": round(reply.ttft_s, 3) if reply and reply.ttft_s is not None else None,
                    "tokens_per_s": round(reply.tokens_per_s, 1)
                    if reply and reply.tokens_per_s is not None
                    else None,
                    "prompt_tokens": reply.prompt_tokens if reply else 0,
                    "completion_tokens": reply.completion_tokens if reply else 0,
                }
            )
    return out


def to_csv(run: GridRun) -> str:
    return csv_text(CSV_COLUMNS, rows(run))


def to_json(run: GridRun) -> str:
    document = {
        "format": "vlm-playground-grid",
        "version": 1,
        "id": run.id,
        "set": run.set_name,
        "started": run.started,
        "models": [{"key": key, "name": run.names.get(key, key)} for key in run.models],
        "sampling": {
            "temperature": run.sampling.temperature,
            "top_p": run.sampling.top_p,
            "max_tokens": run.sampling.max_tokens,
            "seed": run.sampling.seed,
        },
        "items": [item.model_dump() for item in run.items],
        "cells": rows(run),
    }
    return json.dumps(document, indent=2, ensure_ascii=False)


def from_json(text: str, cards: Mapping[str, ModelCard]) -> GridRun:
    """A run written by `to_json`, to resume: its answered cells kept, the others answered again."""
    document = json.loads(text)
    if document.get("format") != "vlm-playground-grid":
        raise ValueError("this file is not a grid run written by the app")
    sampling = SamplingSettings(**document["sampling"])
    models = [model["key"] for model in document["models"]]
    names = {model["key"]: model["name"] for model in document["models"]}
    items = [PromptItem.model_validate(item) for item in document["items"]]
    run = GridRun(
        document["set"], items, models, names, sampling, id=document["id"], started=document["started"]
    )
    for cell in document["cells"]:
        if cell["state"] != "done":
            continue  # answered again on resume
        key = cell["model"]
        source = cards[key].source if key in cards else key
        run.cells.setdefault(cell["item"], {})[key] = Reply(
            key,
            cell["name"],
            source,
            state="done",
            answer=cell["answer"],
            prompt_tokens=cell["prompt_tokens"],
            completion_tokens=cell["completion_tokens"],
            ttft_s=cell["ttft_s"],
            tokens_per_s=cell["tokens_per_s"],
        )
    return run


def thumbnail_uri(path: Path, decoder: VideoDecoderPool | None = None) -> str:
    """A small JPEG of the file as a data URI: a picture, or a clip's middle frame."""
    try:
        if is_video(path):
            if decoder is None:
                return ""
            clip = decoder.decode(path, 3)
            image = Image.fromarray(clip.frames[len(clip.frames) // 2])
        else:
            image = load_image(path)
    except Exception:
        return ""
    image.thumbnail((THUMBNAIL_SIDE, THUMBNAIL_SIDE))
    buffer = io.BytesIO()
    image.convert("RGB").save(buffer, format="JPEG", quality=80)
    return "data:image/jpeg;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


def png_uri(path: Path) -> str:
    return "data:image/png;base64," + base64.b64encode(path.read_bytes()).decode("ascii")


# The grid's own rules (scoped to it, so the page can show the same table), then the report's page.
GRID_STYLE = """
table.grid{border-collapse:collapse;width:100%;table-layout:fixed}
.grid th,.grid td{border:1px solid #ccc;padding:.5rem;vertical-align:top;text-align:left}
.grid td{overflow-wrap:anywhere}
.grid th{background:#f4f4f4}
.grid .answer{white-space:pre-wrap;font-family:ui-monospace,monospace;font-size:.9em}
.grid .facts{color:#666;font-size:.8em;margin-top:.3rem}
.grid .failed{color:#a00}
.grid .yes{color:#070}.grid .no{color:#a00}
.grid img{max-width:160px;display:block;margin-bottom:.3rem}
"""
REPORT_STYLE = "body{font-family:system-ui,sans-serif;margin:1.5rem;color:#222}" + GRID_STYLE


def thumbnails(
    run: GridRun, prompt_set: PromptSet, decoder: VideoDecoderPool | None = None
) -> dict[str, str]:
    """Every file of the run's items as a small inline JPEG (name -> data URI)."""
    names = dict.fromkeys(name for item in run.items for name in item.media)
    return {name: uri for name in names if (uri := thumbnail_uri(prompt_set.path(name), decoder))}


def grid_table(run: GridRun, pictures: Mapping[str, str]) -> str:
    """The grid as an HTML table: items as rows (thumbnails, question, expected answer), models
    as columns (each answer with its time to first token and speed, boxes drawn where the model
    grounds). The page shows it as it fills; the report wraps it."""
    e = html.escape
    head = "".join(f"<th>{e(run.names.get(key, key))}<br><code>{e(key)}</code></th>" for key in run.models)
    body = []
    for item in run.items:
        shown = "".join(f'<img src="{pictures[n]}" alt="{e(n)}">' for n in item.media if n in pictures)
        media = f"<div class=facts>{e(', '.join(item.media))}</div>" if item.media else ""
        expected = f"<div class=facts>expected: {e(item.expected)}</div>" if item.expected else ""
        cells = "".join(grid_cell(item, run.cell(item.id, key)) for key in run.models)
        body.append(
            f"<tr><td><b>{e(item.id)}</b>{shown}<div>{e(item.question)}</div>{media}{expected}</td>{cells}</tr>"
        )
    return (
        f"<table class=grid><thead><tr><th>item</th>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"
    )


def grid_cell(item: PromptItem, reply: Reply | None) -> str:
    e = html.escape
    if reply is None:
        return "<td>not run</td>"
    if reply.state == "failed":
        return f"<td class=failed>{e(reply.error or 'failed')}</td>"
    mark = matches(item.expected, reply.answer) if reply.state == "done" else None
    verdict = (
        ""
        if mark is None
        else f" · <span class={'yes' if mark else 'no'}>{'matches' if mark else 'differs'}</span>"
    )
    boxes = ""
    if reply.boxes_drawn is not None and reply.boxes_drawn.is_file():
        boxes = f'<img src="{png_uri(reply.boxes_drawn)}" alt="boxes drawn">'
    facts = [reply.state]
    if reply.ttft_s is not None:
        facts.append(f"first token {reply.ttft_s:.2f} s")
    if reply.tokens_per_s is not None:
        facts.append(f"{reply.tokens_per_s:.1f} tok/s")
    return (
        f"<td>{boxes}<div class=answer>{e(reply.answer)}</div>"
        f"<div class=facts>{' · '.join(facts)}{verdict}</div></td>"
    )


def describe_sampling(sampling: SamplingSettings) -> str:
    def value(v: object) -> str:
        return "each model's default" if v is None else str(v)

    return (
        f"temperature {value(sampling.temperature)}, top-p {value(sampling.top_p)}, "
        f"max tokens {value(sampling.max_tokens)}, "
        f"seed {'random' if sampling.seed is None else sampling.seed}"
    )


def to_html(run: GridRun, pictures: Mapping[str, str]) -> str:
    """A report that opens anywhere with no server: `pictures` (`thumbnails`) and drawn boxes
    are inline."""
    e = html.escape
    return (
        "<!doctype html><html><head><meta charset=utf-8>"
        f"<title>{e(run.set_name)}: {len(run.models)} models</title>"
        f"<style>{REPORT_STYLE}</style></head><body>"
        f"<h1>{e(run.set_name)}</h1>"
        f"<p>{len(run.items)} items on {len(run.models)} models · started {e(run.started)} · "
        f"{run.done} of {run.total} answers · {e(describe_sampling(run.sampling))}</p>"
        f"{grid_table(run, pictures)}</body></html>\n"
    )


@dataclass
class GridWork:
    """A page's grid: the set it checked, what each model can run of it, and its run (kept to
    resume). `close` deletes the set's uploaded or unzipped files."""

    prompt_set: PromptSet
    checked: Checked
    run: GridRun | None = None
    pictures: dict[str, str] = field(default_factory=dict)  # the set's thumbnails, made once
    stop_requested: bool = False
    running: bool = False  # one run at a time: a second Run, or a new check, waits for it
    # The run's drawn boxes and exports (a session folder: `app.domain.sessions` counts it as owned).
    folder: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix=SESSION_FOLDER_PREFIX)))

    def close(self) -> None:
        self.prompt_set.close()
        shutil.rmtree(self.folder, ignore_errors=True)
