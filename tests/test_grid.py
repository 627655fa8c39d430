"""Prompt sets run across models into a grid: sets read and checked up front (bad lines, missing
and broken files, hostile zips, per-model limits), runs on the real engine with the seeing demo
model (whose answers can be checked) and a random-weight twin, stopped and resumed, giving way
to a chat user, and the command line's reports. The Grid tab is tested in Chromium
(`test_ui_chat.py`, `test_ui_views.py`)."""

from __future__ import annotations

import asyncio
import contextlib
import csv
import io
import json
import os
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from PIL import Image

from app.catalog.cards import ModelCard, load_cards
from app.config import Settings
from app.demo.models import SEEING_FOLDER
from app.demo.seeing_model import BASE_CARD, SEEING_KEY, seeing_card
from app.domain.grid import (
    GridRun,
    from_json,
    from_record,
    media_records,
    run_grid,
    run_order,
    thumbnails,
    to_csv,
    to_html,
    to_json,
    to_record,
)
from app.domain.promptsets import PromptSetError, check_set, example_sets, read_set
from app.engines.base import SamplingSettings
from app.engines.manager import EngineManager
from app.engines.vllm_engine import VllmEngineFactory
from app.media.loading import VideoDecoderPool
from app.storage.history import History, sqlite_url

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "static" / "examples"
EXAMPLE_SET = example_sets()["shapes-and-colours"]
TWIN = "tiny-b"  # the LLaVA twin: takes images, not clips
GREEDY = SamplingSettings(temperature=0.0, max_tokens=8)


# --- reading and checking a set ---------------------------------------------------------------


def test_the_built_in_set_has_six_items_of_images_and_a_clip():
    prompt_set = read_set(EXAMPLE_SET)
    assert len(prompt_set.items) == 6
    media = [name for item in prompt_set.items for name in item.media]
    assert any(name.endswith(".mp4") for name in media) and all((EXAMPLES / name).is_file() for name in media)


def test_jsonl_and_csv_give_the_same_items(tmp_path: Path):
    rows = [
        {"id": "a", "question": "What shape?", "media": ["one.png"], "expected": "circle"},
        {"question": 'Two pictures, with a comma, and "quotes"', "media": ["one.png", "two.png"]},
    ]
    jsonl = tmp_path / "set.jsonl"
    jsonl.write_text("\n".join(json.dumps(row) for row in rows) + "\n\n", encoding="utf-8")
    table = tmp_path / "set.csv"
    with table.open("w", encoding="utf-8", newline="") as out:
        writer = csv.DictWriter(out, ["id", "question", "media", "expected"])
        writer.writeheader()
        for row in rows:
            writer.writerow({**row, "media": ";".join(row["media"])})
    from_jsonl, from_csv = read_set(jsonl).items, read_set(table).items
    assert from_jsonl == from_csv
    assert [item.id for item in from_csv] == ["a", "item-2"] and from_csv[1].media == ["one.png", "two.png"]


@pytest.mark.parametrize(
    ("name", "text", "said"),
    [
        ("set.jsonl", '{"question": "ok"}\n{"question": "no closing brace"\n', "line 2: not JSON"),
        ("set.jsonl", '{"question": "ok", "colour": "blue"}\n', "line 1: colour: Extra inputs"),
        ("set.jsonl", '{"media": ["a.png"]}\n', "line 1: question: Field required"),
        ("set.jsonl", '{"id": "x", "question": "a"}\n{"id": "x", "question": "b"}\n', "repeated: x"),
        ("set.jsonl", "\n\n", "has no items"),
        ("set.csv", "prompt,media\nWhat?,a.png\n", "`question` among them"),
        ("set.txt", "What?\n", "a .jsonl or a .csv file"),
    ],
)
def test_a_set_that_cannot_be_read_says_which_line_and_what_to_change(tmp_path: Path, name, text, said):
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    with pytest.raises(PromptSetError, match=said):
        read_set(path)


def zipped(tmp_path: Path, files: dict[str, bytes]) -> Path:
    archive = tmp_path / "media.zip"
    with zipfile.ZipFile(archive, "w") as out:
        for name, data in files.items():
            out.writestr(name, data)
    return archive


def test_media_come_in_a_zip_even_one_holding_a_folder(tmp_path: Path):
    (tmp_path / "set.jsonl").write_text('{"question": "Shape?", "media": ["one_shape.png"]}\n')
    archive = zipped(tmp_path, {"pictures/one_shape.png": (EXAMPLES / "one_shape.png").read_bytes()})
    prompt_set = read_set(tmp_path / "set.jsonl", archive)
    try:
        assert prompt_set.path("one_shape.png").is_file()
    finally:
        prompt_set.close()
    assert not prompt_set.folder.exists()


@pytest.mark.parametrize("hostile", ["../escape.png", "/etc/escape.png"])
def test_a_zip_with_paths_outside_the_set_is_refused_and_writes_nothing(tmp_path: Path, hostile: str):
    (tmp_path / "set.jsonl").write_text('{"question": "Shape?"}\n')
    archive = zipped(tmp_path, {"ok.png": b"x", hostile: b"x"})
    before = set(tmp_path.parent.iterdir())
    with pytest.raises(PromptSetError, match="a path outside the set"):
        read_set(tmp_path / "set.jsonl", archive)
    assert set(tmp_path.parent.iterdir()) == before


@pytest.fixture(scope="module")
def decoder() -> Iterator[VideoDecoderPool]:
    pool = VideoDecoderPool(workers=1)
    yield pool
    pool.close()


@pytest.fixture(scope="module")
def cards(tiny_cards: dict[str, ModelCard]) -> dict[str, ModelCard]:
    return {SEEING_KEY: seeing_card(load_cards()[BASE_CARD], SEEING_FOLDER), TWIN: tiny_cards[TWIN]}


def test_checking_lists_missing_broken_and_outside_files_and_each_models_limits(
    loop, tmp_path: Path, decoder, cards
):
    for name in ("one_shape.png", "colour_change.mp4"):
        (tmp_path / name).write_bytes((EXAMPLES / name).read_bytes())
    (tmp_path / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n not really")
    Image.new("1", (9000, 9000)).save(tmp_path / "huge.png")  # 81 megapixels in a few kB
    lines = [
        {"id": "fine", "question": "Shape?", "media": ["one_shape.png"]},
        {"id": "missing", "question": "Shape?", "media": ["gone.png"]},
        {"id": "broken", "question": "Shape?", "media": ["broken.png"]},
        {"id": "outside", "question": "Shape?", "media": ["../../etc/passwd"]},
        {"id": "clip", "question": "End colour?", "media": ["colour_change.mp4"]},
        {"id": "five", "question": "Five?", "media": ["one_shape.png"] * 5},
        {"id": "huge", "question": "Shape?", "media": ["huge.png", "one_shape.png"]},
    ]
    (tmp_path / "set.jsonl").write_text("\n".join(json.dumps(line) for line in lines))
    prompt_set = read_set(tmp_path / "set.jsonl")
    checked = loop.run(check_set(prompt_set, list(cards.values()), decoder))
    refused = "\n".join(checked.refused)
    assert "item 2 (missing): gone.png is not among the set's files" in refused
    assert "item 3 (broken): broken.png: This file is not an image the app can read" in refused
    assert "item 4 (outside): ../../etc/passwd is outside the set's files" in refused
    # Per model: the LLaVA twin takes no clip; neither takes five pictures (four at most).
    assert "item 5 (clip): LLaVA 1.5 7B: random-weight twin does not take videos" in refused
    assert checked.runnable == {SEEING_KEY: ["fine", "clip"], TWIN: ["fine"]}
    assert {("clip", TWIN), ("five", TWIN), ("five", SEEING_KEY)} == set(checked.refused_cells)
    assert (
        "item 6 (five): Shapes and colours: tiny demo model trained here takes at most 4 images in one "
        "message: remove 1 image from the item." in refused
    )
    assert "item 7 (huge): huge.png: This image is 9000 x 9000 pixels" in refused
    assert str(tmp_path) not in refused  # no server path in what the user reads
    # The history keeps the files of the items that passed, for weeks: never a refused file.
    records, files = media_records(prompt_set, checked)
    assert sorted(records) == ["colour_change.mp4", "one_shape.png"] and len(files) == 2


# --- runs on the real engine -------------------------------------------------------------------


class CountingFactory(VllmEngineFactory):
    """The app's factory, recording each build and each request (model, question) in order."""

    def __init__(self, settings: Settings) -> None:
        super().__init__(settings)
        self.builds: list[str] = []
        self.asked: list[tuple[str, str]] = []

    async def build(self, card: Any, report: Any, devices: tuple[int, ...] = (0,)) -> Any:
        self.builds.append(card.key)
        engine = await super().build(card, report, devices)
        generate = engine.generate

        def recorded(card: Any, messages: Any, sampling: SamplingSettings, request_id: str) -> Any:
            self.asked.append((card.key, messages[-1]["content"][-1]["text"]))
            return generate(card, messages, sampling, request_id)

        engine.generate = recorded
        return engine


@pytest.fixture(scope="module")
def engines(loop, cards) -> Iterator[tuple[EngineManager, CountingFactory]]:
    # One model in memory at a time: a run that swapped per item would build 12 times.
    settings = Settings(gpu_count=0, max_resident=1, idle_unload_s=0, drain_timeout_s=30, quantum_s=2)
    factory = CountingFactory(settings)
    manager = EngineManager(cards, settings, factory)
    yield manager, factory
    loop.run(manager.close())


def new_run(cards: dict[str, ModelCard]) -> tuple[GridRun, Any]:
    prompt_set = read_set(EXAMPLE_SET)
    names = {key: card.display_name for key, card in cards.items()}
    return GridRun(prompt_set.name, prompt_set.items, [SEEING_KEY, TWIN], names, GREEDY), prompt_set


async def run_to_end(
    boxes: Path, run: GridRun, prompt_set: Any, cards: dict[str, ModelCard], manager, decoder
) -> list[str]:
    checked = await check_set(prompt_set, list(cards.values()), decoder)
    progress = [
        update.progress()
        async for update in run_grid(run, prompt_set, cards, checked, manager, decoder, boxes=boxes)
    ]
    return progress


def test_a_set_runs_model_by_model_with_one_load_each_and_the_seeing_model_answers_it(
    loop, engines, cards, decoder, tmp_path: Path
):
    manager, factory = engines
    run, prompt_set = new_run(cards)
    factory.builds.clear()
    factory.asked.clear()
    progress = loop.run(run_to_end(tmp_path, run, prompt_set, cards, manager, decoder))
    # Every item on a model before the next model: one build each, requests grouped by model.
    assert sorted(factory.builds) == sorted([SEEING_KEY, TWIN]) and len(factory.builds) == 2
    models_asked = [key for key, _ in factory.asked]
    assert models_asked == sorted(models_asked, key=models_asked.index) and len(set(models_asked)) == 2
    # The clip is refused for the twin up front; everything else is answered.
    states = {(i, k): r.state for i, row in run.cells.items() for k, r in row.items()}
    assert states.pop(("clip-end", TWIN)) == "failed" and set(states.values()) == {"done"}
    assert run.done == run.total == 12
    # The seeing model's answers are right: its pixels reached it through the grid.
    for item in run.items:
        assert run.cell(item.id, SEEING_KEY).answer.strip() == item.expected
    assert all(run.cell(i.id, SEEING_KEY).ttft_s is not None for i in run.items)
    # The progress line counted up to the whole and named the time left while it could.
    assert progress[-1] == "11 of 12 answers, 1 refused or failed" and any(
        "left" in line for line in progress
    )

    # The exports: one CSV row per cell, JSON that resumes to the same cells, HTML that stands
    # alone (thumbnails inline, no server paths).
    table = list(csv.DictReader(io.StringIO(to_csv(run))))
    assert len(table) == 12 and sum(row["matches_expected"] == "True" for row in table) == 6
    again = from_json(to_json(run), cards)
    assert {(i, k) for i, row in again.cells.items() for k in row} == {
        (i, k) for i, row in run.cells.items() for k, r in row.items() if r.state == "done"
    }
    page = to_html(run, thumbnails(run, prompt_set, decoder))
    assert page.count("data:image/jpeg;base64,") == 7  # six items' files and the clip's frame
    assert str(ROOT) not in page and "What colour does the clip end with?" in page
    assert page.count("matches") == 6

    # Stored in the history as a grid, and read back whole.
    history = History(sqlite_url(tmp_path), tmp_path / "media")
    try:
        records, files = media_records(
            prompt_set, loop.run(check_set(prompt_set, list(cards.values()), decoder))
        )
        history.save("browser", to_record(run, records), files)
        stored = from_record(history.load("browser", run.id), cards, GREEDY)
        assert stored.items == run.items and stored.models == run.models
        assert stored.cell("shape", SEEING_KEY).answer == run.cell("shape", SEEING_KEY).answer
        assert stored.cell("clip-end", TWIN).state == "failed" and stored.cell("clip-end", TWIN).error
    finally:
        history.close()


def test_a_stopped_run_keeps_its_answers_and_resuming_asks_only_the_rest(
    loop, engines, cards, decoder, tmp_path: Path
):
    manager, factory = engines
    run, prompt_set = new_run(cards)

    async def stop_after(count: int) -> None:
        checked = await check_set(prompt_set, list(cards.values()), decoder)
        updates = run_grid(run, prompt_set, cards, checked, manager, decoder, boxes=tmp_path)
        async with contextlib.aclosing(updates):
            async for update in updates:
                if sum(r.state == "done" for row in update.cells.values() for r in row.values()) >= count:
                    break

    loop.run(stop_after(3))
    kept = {
        (i, k): (r.answer, r.ttft_s)
        for i, row in run.cells.items()
        for k, r in row.items()
        if r.state == "done"
    }
    assert 3 <= len(kept) < 11
    assert all(r.state in ("done", "stopped", "failed") for row in run.cells.values() for r in row.values())
    # Through the JSON the command line keeps, as after a Ctrl-C.
    resumed = from_json(to_json(run), cards)
    factory.asked.clear()
    loop.run(run_to_end(tmp_path, resumed, prompt_set, cards, manager, decoder))
    assert resumed.done == resumed.total
    for (item, key), (answer, ttft) in kept.items():
        # Kept as they were (the JSON keeps times to the millisecond).
        assert resumed.cell(item, key).answer == answer
        assert resumed.cell(item, key).ttft_s == pytest.approx(ttft, abs=1e-3)
    assert len(factory.asked) == 11 - len(kept)  # 12 cells, one refused up front


def test_a_run_gives_way_to_a_chat_user_of_another_model(loop, engines, cards, decoder, tmp_path: Path):
    """A team's run is on the twin when a chat user asks the seeing model: the user is answered
    before the run's remaining items, not after the whole set."""
    manager, _ = engines
    prompt_set = read_set(EXAMPLE_SET)
    items = [replace_id(prompt_set.items[i % 5], f"n{i}") for i in range(12)]  # images only
    run = GridRun("long", items, [TWIN], {}, replace(GREEDY, max_tokens=24))
    order: list[str] = []

    async def scenario() -> None:
        checked = await check_set(replace_items(prompt_set, items), list(cards.values()), decoder)
        updates = run_grid(
            run, replace_items(prompt_set, items), cards, checked, manager, decoder, boxes=tmp_path
        )
        runner = asyncio.create_task(drain(updates))
        while sum(r.state == "done" for row in run.cells.values() for r in row.values()) < 2:
            await asyncio.sleep(0.05)
        messages = [{"role": "user", "content": [{"type": "text", "text": "How many shapes are there?"}]}]
        async for _ in manager.stream(SEEING_KEY, messages, GREEDY):
            pass
        order.append(
            f"chat answered with {sum(r.state == 'done' for r in run_column(run, TWIN))} twin cells done"
        )
        await runner

    loop.run(scenario())
    done_when_chatted = int(order[0].split(" with ")[1].split()[0])
    assert done_when_chatted < len(items), order
    assert all(r.state == "done" for r in run_column(run, TWIN))


def run_column(run: GridRun, key: str) -> list[Any]:
    return [run.cell(item.id, key) for item in run.items]


def replace_id(item: Any, new_id: str) -> Any:
    return item.model_copy(update={"id": new_id})


def replace_items(prompt_set: Any, items: list[Any]) -> Any:
    return replace(prompt_set, items=items)


async def drain(updates: Any) -> None:
    async for _ in updates:
        pass


def test_models_in_memory_run_first():
    assert run_order(["a", "b", "c"], ["c"]) == ["c", "a", "b"]
    assert run_order(["a", "b"], []) == ["a", "b"]


# --- the command line --------------------------------------------------------------------------


def eval_command(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "app", "eval", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


@pytest.mark.slow
@pytest.mark.vllm
def test_the_command_line_runs_a_set_into_reports_and_resumes(
    vllm_model_infos: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    """`python -m app eval`'s `main` in this process, its engines from the tests' fork server
    rather than a cold `spawn` each (the app's own `spawn` start is `test_shutdown`'s and
    `test_main`'s; the command's start in a process of its own is the test below), with the
    environment it sets for vLLM put back after each run."""
    from app.evaluate import main

    env = {**os.environ, "APP_DEMO_DIR": str(tmp_path / "demo"), "APP_HISTORY": "0"}

    def run(*args: str) -> tuple[int, str]:
        with mock.patch.dict(os.environ, env, clear=True):
            status = main(list(args))
        return status, capsys.readouterr().err

    common = ["--models", f"{SEEING_KEY},demo_llava", "--set", str(EXAMPLE_SET), "--temperature", "0"]
    report = tmp_path / "out" / "report.html"
    status, said = run(*common, "--max-tokens", "8", "--out", str(report))
    assert status == 0, said[-2000:]
    assert "11 of 12 answers, 1 refused or failed" in said and "Traceback" not in said
    assert "refused: item 6 (clip-end): LLaVA 1.5 7B: random-weight twin does not take videos" in said
    page = report.read_text(encoding="utf-8")
    assert page.count("<tr>") == 7 and page.count("matches") == 6 and "data:image/jpeg;base64," in page
    state = report.with_name("report.grid.json")
    document = json.loads(state.read_text(encoding="utf-8"))
    assert [c["answer"].strip() for c in document["cells"] if c["model"] == SEEING_KEY] == [
        "triangle", "right", "three", "green", "green", "red",
    ]  # fmt: skip

    # As if stopped with two of the seeing model's cells unanswered: --resume answers only them.
    first_times = {(c["item"], c["model"]): c["ttft_s"] for c in document["cells"]}
    for cell in document["cells"]:
        if cell["model"] == SEEING_KEY and cell["item"] in ("count", "clip-end"):
            cell["state"], cell["answer"] = "stopped", ""
    state.write_text(json.dumps(document), encoding="utf-8")
    table = tmp_path / "out" / "report.csv"  # its state file is the same report.grid.json
    status, said = run(*common, "--max-tokens", "8", "--out", str(table), "--resume")
    assert status == 0, said[-2000:]
    assert "9 of 12 answers already there" in said  # the 10th cell is the refused clip
    rows = list(csv.DictReader(io.StringIO(table.read_text(encoding="utf-8"))))
    assert [r["answer"].strip() for r in rows if r["model"] == SEEING_KEY] == [
        "triangle", "right", "three", "green", "green", "red",
    ]  # fmt: skip
    again = json.loads(table.with_name("report.grid.json").read_text(encoding="utf-8"))
    for cell in again["cells"]:
        key = (cell["item"], cell["model"])
        if cell["model"] == SEEING_KEY and cell["item"] in ("count", "clip-end"):
            continue
        assert cell["ttft_s"] == first_times[key]  # kept, not asked again


def test_a_mistake_on_the_command_line_is_one_line_with_exit_code_2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
):
    """Started as a user starts it, in a process of its own (it stops before any engine, about
    8 s), then the other mistakes through the same `main` in this process."""
    from app.evaluate import main

    monkeypatch.setenv("APP_DEMO_DIR", str(tmp_path / "demo"))
    monkeypatch.setenv("APP_HISTORY", "0")
    out = str(tmp_path / "report.html")
    started = eval_command(
        "--models", "nope,demo_llava", "--set", str(EXAMPLE_SET), "--out", out, env=dict(os.environ)
    )
    assert started.returncode == 2 and "Traceback" not in started.stderr, started.stderr[-2000:]
    assert started.stderr.strip().splitlines() == [
        "error: --models: no card 'nope' (`python -m app --list` shows the keys)."
    ]
    assert main(["--models", f"{SEEING_KEY},demo_llava", "--set", str(EXAMPLE_SET), "--out", "r.txt"]) == 2
    assert capsys.readouterr().err.strip() == "error: --out must end in .html, .csv or .json."
    assert not Path("r.txt").exists()


def test_an_item_too_long_for_a_models_context_is_refused_up_front_for_that_model(
    loop, tmp_path, decoder, cards
):
    twin = cards[TWIN]
    short = twin.model_copy(
        update={
            "key": "short-context",
            "reference_engine_args": {**twin.reference_engine_args, "max_model_len": 700},
        }
    )
    (tmp_path / "one_shape.png").write_bytes((EXAMPLES / "one_shape.png").read_bytes())
    lines = [
        {"id": "short", "question": "Shape?", "media": ["one_shape.png"]},
        {"id": "long", "question": "Describe it. " * 120, "media": ["one_shape.png"]},
    ]
    (tmp_path / "set.jsonl").write_text("\n".join(json.dumps(line) for line in lines))
    checked = loop.run(check_set(read_set(tmp_path / "set.jsonl"), [twin, short], decoder))
    assert checked.runnable == {TWIN: ["short", "long"], "short-context": ["short"]}
    (line,) = checked.refused
    assert line.startswith("item 2 (long): This item would make a prompt of") and "at most 700" in line


def bomb(tmp_path: Path, entries: int, each: int) -> Path:
    """A zip of `entries` files of `each` zero bytes: tiny packed, huge unpacked."""
    archive = tmp_path / "bomb.zip"
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED) as out:
        for index in range(entries):
            out.writestr(f"f{index}.png", b"\0" * each)
    return archive


@pytest.mark.parametrize(
    ("entries", "each", "said"),
    [
        (3002, 10, "holds 3,002 files"),
        (1, 300 * 2**20, "times its packed size"),
        # Each entry at the size the per-entry rule starts above: 64 MiB from a zip of about
        # 70 KB (a hostile review's 950 of them, 0.93 GB from 1 MB, passed the per-entry rule).
        (64, 2**20, "times its packed size"),
    ],
    ids=["many entries", "high ratio", "many entries of 1 MiB"],
)
def test_a_zip_bomb_is_refused_before_unpacking_and_leaves_nothing(
    tmp_path: Path, entries: int, each: int, said: str, monkeypatch: pytest.MonkeyPatch
):
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "scratch"))
    (tmp_path / "scratch").mkdir()
    (tmp_path / "set.jsonl").write_text('{"question": "Shape?", "media": ["f0.png"]}\n')
    archive = bomb(tmp_path, entries, each)
    assert archive.stat().st_size < 2**20 * 2
    with pytest.raises(PromptSetError) as refused:
        read_set(tmp_path / "set.jsonl", archive)
    assert said in str(refused.value) and "\n" not in str(refused.value)
    assert list((tmp_path / "scratch").iterdir()) == []


def test_a_zip_whose_header_lies_about_a_size_is_refused(tmp_path: Path):
    archive = zipped(tmp_path, {"a.png": b"x" * 5000})
    data = bytearray(archive.read_bytes())
    # The central directory says 10 bytes (both headers' size fields), the entry holds 5,000.
    for offset in [i for i in range(len(data) - 4) if data[i : i + 4] in (b"PK\x03\x04", b"PK\x01\x02")]:
        field = 22 if data[offset : offset + 4] == b"PK\x03\x04" else 24
        data[offset + field : offset + field + 4] = (10).to_bytes(4, "little")
    archive.write_bytes(bytes(data))
    (tmp_path / "set.jsonl").write_text('{"question": "Shape?", "media": ["a.png"]}\n')
    with pytest.raises(PromptSetError):
        read_set(tmp_path / "set.jsonl", archive)


@pytest.mark.parametrize(
    "hostile", ['=HYPERLINK("http://x.invalid","click")', "+1+1", "-2+3", "@SUM(A1)", "\t=1"]
)
def test_a_csv_export_never_hands_a_spreadsheet_a_formula(hostile: str):
    from app.domain.grid import GridRun
    from app.domain.leaderboard import to_csv as leaderboard_csv
    from app.domain.promptsets import PromptItem
    from app.domain.replies import Reply
    from app.engines.base import SamplingSettings

    item = PromptItem(id=hostile[:20], question=hostile)
    run = GridRun("set", [item], ["m"], {"m": hostile}, SamplingSettings())
    run.cells[item.id] = {"m": Reply("m", hostile, "", answer=hostile, state="done")}
    for text in (to_csv(run), leaderboard_csv([{"model": hostile, "name": hostile}])):
        cells = [cell for row in csv.reader(io.StringIO(text)) for cell in row]
        assert not any(cell.startswith(("=", "+", "-", "@", "\t", "\r")) for cell in cells), cells
        assert "'" + hostile in cells  # kept, as text


def test_the_progress_line_never_counts_a_refused_cell_as_answered():
    from app.domain.grid import GridRun
    from app.domain.promptsets import PromptItem
    from app.domain.replies import Reply

    items = [PromptItem(id=f"q{i}", question="?") for i in range(3)]
    run = GridRun("set", items, ["a", "b"], {}, SamplingSettings())
    for item in items:
        run.cells[item.id] = {key: Reply(key, key, "", state="done") for key in ("a", "b")}
    assert run.summary() == "6 of 6 answers"
    run.cells["q2"]["b"].state = "failed"  # refused up front: it has an outcome, not an answer
    run.cells["q1"]["a"].state = "stopped"
    assert run.summary() == "4 of 6 answers, 1 refused or failed" and run.done == 5
    assert run.progress().startswith(run.summary())
