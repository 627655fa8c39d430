"""The grid tab: a prompt set (uploaded, or built in) run across 2 to 8 models into a grid of
answers, with progress, stop and resume, exports, and a place in the history.

Every handler takes the tab's `Visit` and changes only its `grid` (`app.domain.grid.GridWork`).
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import gradio as gr

from app.domain import grid
from app.domain.conversation import SESSION_FOLDER_PREFIX, ConversationError, user_message
from app.domain.grid import GridRun, GridWork
from app.domain.promptsets import PromptSet, PromptSetError, check_set, example_sets, read_set
from app.domain.sessions import Visit
from app.engines.base import SamplingSettings
from app.storage.history import History
from app.views.chat import NO_VISIT, PRIVATE
from app.views.services import WARNING, Playground

INTRO = (
    "Run a set of questions with their images and clips across several models, and read the "
    "answers side by side. Upload a set (a `.jsonl` or `.csv` of questions naming their files, "
    "and the files themselves or a `.zip` of them), or pick a built-in one. Each model answers "
    "every item before the next model is loaded; chat users go first."
)
RUNNING = "This set is running: stop it first, or wait for it to end."
SET_FORMAT = (
    'One item a line: `{"id": "q1", "question": "What shape is it?", "media": ["a.png"], '
    '"expected": "circle"}` (CSV: columns `question`, `media` separated by `;`, `id`, `expected`).'
)


class GridView:
    def __init__(self, playground: Playground) -> None:
        self.playground = playground

    @property
    def history(self) -> History | None:
        history = self.playground.history
        return history if history is not None and history.keep_conversations else None

    # --- handlers ----------------------------------------------------------------------------

    async def check(
        self,
        builtin: str | None,
        set_file: str | None,
        media: list[str] | None,
        keys: list[str],
        visit: Visit | None,
    ) -> tuple[Any, ...]:
        """Reads the set and checks every item against the media pipeline and each model."""
        try:
            if visit is None:
                raise ConversationError(NO_VISIT)
            if visit.grid is not None and visit.grid.running:
                raise ConversationError(RUNNING)
            cards = self.cards(keys)
            prompt_set = await asyncio.to_thread(self.read, builtin, set_file, media or [])
            checked = await check_set(prompt_set, cards, self.playground.decoder)
        except Exception as error:
            return WARNING + user_message(error), gr.Button(interactive=False), gr.skip(), gr.skip()
        if visit.grid is not None:
            visit.grid.close()
        visit.grid = work = GridWork(prompt_set, checked)
        names = {card.key: card.display_name for card in cards}
        work.run = GridRun(
            prompt_set.name, prompt_set.items, [card.key for card in cards], names, SamplingSettings()
        )
        work.pictures = await asyncio.to_thread(
            grid.thumbnails, work.run, prompt_set, self.playground.decoder
        )
        runnable = sum(len(ids) for ids in checked.runnable.values())
        lines = [
            f"**{prompt_set.name}**: {len(prompt_set.items)} items on {len(cards)} models; "
            f"{runnable} of {work.run.total} answers can run."
        ]
        if checked.refused:
            lines += ["", "Refused (the rest runs without them):", *(f"- {line}" for line in checked.refused)]
        report = "\n".join(lines)
        return report, gr.Button(interactive=checked.any_runnable), progress_bar(work.run), self.table(work)

    async def run(self, visit: Visit | None) -> AsyncIterator[tuple[Any, ...]]:
        """Runs (or resumes) the checked set; the grid fills as answers stream."""
        self.playground.active(visit)
        work = visit.grid if visit is not None else None
        if work is None or work.run is None:
            yield "Check a set first.", gr.skip(), gr.skip(), *no_exports(), gr.skip()
            return
        run = work.run
        if work.running:
            yield RUNNING, gr.skip(), gr.skip(), *no_exports(), gr.skip()
            return
        work.running, work.stop_requested = True, False
        held = contextlib.ExitStack()  # a run is one of the visitor's answers (`app.views.fairness`)
        try:
            held.enter_context(self.playground.allowance.held(visit))
            cards = {key: self.playground.servable(key) for key in run.models}
            yield "", progress_bar(run), self.table(work), *no_exports(), gr.Button(interactive=True)
            manager, decoder = self.playground.manager, self.playground.decoder
            updates = grid.run_grid(
                run, work.prompt_set, cards, work.checked, manager, decoder, boxes=work.folder
            )
            async with contextlib.aclosing(updates):
                async for _ in updates:
                    self.playground.active(visit)  # a long run is the tab's activity
                    yield gr.skip(), progress_bar(run), self.table(work), *no_exports(), gr.skip()
                    if work.stop_requested:
                        break
        except Exception as error:
            yield (
                WARNING + user_message(error),
                progress_bar(run),
                self.table(work),
                *no_exports(),
                gr.Button(interactive=False),
            )
            return
        finally:
            held.close()
            work.running = False
        notice = await self.save(visit, work)
        if work.stop_requested:
            notice = f"Stopped with {run.summary()}; press Run to go on. {notice}".strip()
        yield notice, progress_bar(run), self.table(work), *self.exports(work), gr.Button(interactive=False)

    def stop(self, visit: Visit | None) -> None:
        if visit is not None and visit.grid is not None:
            visit.grid.stop_requested = True

    def shown(self, visit: Visit | None) -> tuple[Any, ...]:
        """The grid as the tab holds it (after a reload, or a run reopened from the history)."""
        work = visit.grid if visit is not None else None
        if work is None or work.run is None:
            return gr.skip(), gr.skip(), *no_exports()
        return progress_bar(work.run), self.table(work), *self.exports(work)

    # --- what the handlers share ---------------------------------------------------------------

    def cards(self, keys: list[str] | None) -> list[Any]:
        keys = list(keys or [])
        if not grid.MIN_MODELS <= len(keys) <= grid.MAX_MODELS:
            raise ConversationError(f"Pick {grid.MIN_MODELS} to {grid.MAX_MODELS} models to run the set on.")
        return [self.playground.servable(key) for key in keys]

    @staticmethod
    def read(builtin: str | None, set_file: str | None, media: list[str]) -> PromptSet:
        """The set the user gave: an uploaded file with its files (or a zip), else a built-in one."""
        if set_file:
            zips = [m for m in media if m.lower().endswith(".zip")]
            if zips:
                return read_set(Path(set_file), Path(zips[0]), name=Path(set_file).stem)
            # The files under the names the set uses: the upload cache names them by content.
            folder = Path(tempfile.mkdtemp(prefix=SESSION_FOLDER_PREFIX))
            for upload in media:
                shutil.copyfile(upload, folder / Path(upload).name)
            copied = folder / Path(set_file).name
            shutil.copyfile(set_file, copied)
            try:
                prompt_set = read_set(copied, folder)
            except BaseException:
                shutil.rmtree(folder, ignore_errors=True)
                raise
            prompt_set.unpacked = folder
            return prompt_set
        sets = example_sets()
        if builtin in sets:
            return read_set(sets[builtin])
        raise PromptSetError("Upload a set file (.jsonl or .csv), or pick a built-in set.")

    def table(self, work: GridWork) -> str:
        if work.run is None:
            return ""
        return f"<style>{grid.GRID_STYLE}</style>" + grid.grid_table(work.run, work.pictures)

    async def save(self, visit: Visit, work: GridWork) -> str:
        """Stores the run in the history (with its files); a line if that failed."""
        history = self.history
        if history is None or work.run is None:
            return ""
        try:
            records, files = await asyncio.to_thread(grid.media_records, work.prompt_set, work.checked)
            await asyncio.to_thread(history.save, visit.browser_id, grid.to_record(work.run, records), files)
        except Exception:
            return "(It could not be stored in the history.)"
        return ""

    def exports(self, work: GridWork) -> tuple[Any, Any, Any]:
        run = work.run
        if run is None:
            return no_exports()
        stem = f"grid-{run.set_name}-{run.id[:8]}"
        files = {"csv": grid.to_csv(run), "json": grid.to_json(run), "html": grid.to_html(run, work.pictures)}
        paths = []
        for suffix, text in files.items():
            path = work.folder / f"{stem}.{suffix}"
            path.write_text(text, encoding="utf-8")
            paths.append(gr.DownloadButton(value=str(path), interactive=True))
        return paths[0], paths[1], paths[2]

    # --- layout ------------------------------------------------------------------------------

    def layout(self, visit: gr.State) -> list[Any]:
        """The tab; returns what `shown` updates (a page load, a run reopened from the history)."""
        gr.Markdown(INTRO)
        servable = self.playground.model_options()
        with gr.Row():
            with gr.Column():
                builtin = gr.Dropdown(
                    list(example_sets()), value=None, label="A built-in set", elem_id="grid-builtin"
                )
                set_file = gr.File(
                    label="Or your set (.jsonl or .csv)",
                    file_types=[".jsonl", ".csv"],
                    type="filepath",
                    elem_id="grid-set",
                )
                media = gr.File(
                    label="Its images and clips, or a .zip of them",
                    file_count="multiple",
                    file_types=["image", "video", ".zip"],
                    type="filepath",
                    elem_id="grid-media",
                )
                gr.Markdown(SET_FORMAT, elem_id="grid-format")
            with gr.Column():
                keys = gr.Dropdown(
                    servable,
                    multiselect=True,
                    max_choices=grid.MAX_MODELS,
                    label=f"Models ({grid.MIN_MODELS} to {grid.MAX_MODELS})",
                    elem_id="grid-models",
                )
                with gr.Row():
                    # Open once the tab has its session, as the message boxes (`Page.resume`).
                    self.check_button = check = gr.Button(
                        "Check the set", elem_id="grid-check", size="sm", interactive=False
                    )
                    run = gr.Button(
                        "Run", elem_id="grid-run", variant="primary", interactive=False, size="sm"
                    )
                    # Live only while a run is: a red Stop on an idle grid looked like a run going.
                    stop = gr.Button(
                        "Stop", elem_id="grid-stop", variant="stop", interactive=False, size="sm"
                    )
                notice = gr.Markdown(elem_id="grid-notice")
        progress = gr.HTML(elem_id="grid-progress")
        table = gr.HTML(elem_id="grid-table", padding=False)
        with gr.Row():
            exports = [
                gr.DownloadButton(label, elem_id=f"grid-{suffix}", interactive=False, size="sm")
                for label, suffix in (("Export CSV", "csv"), ("Export JSON", "json"), ("HTML report", "html"))
            ]
        check.click(
            self.check, [builtin, set_file, media, keys, visit], [notice, run, progress, table], **PRIVATE
        )
        self.ran = run.click(
            self.run, [visit], [notice, progress, table, *exports, stop], show_progress="hidden", **PRIVATE
        )
        stop.click(self.stop, [visit], None, concurrency_limit=None, **PRIVATE)
        self.restored = [progress, table, *exports]
        return self.restored


def no_exports() -> tuple[Any, Any, Any]:
    return gr.skip(), gr.skip(), gr.skip()


def progress_bar(run: GridRun) -> str:
    return (
        f'<div class=grid-progress><progress max="{run.total}" value="{run.done}"></progress> '
        f"<span>{run.progress()}</span></div>"
    )
