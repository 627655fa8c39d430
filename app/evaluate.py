"""`python -m app eval`: a prompt set across models from the command line, into a report.

    python -m app eval --models qwen2_5_vl,llava --set set.jsonl --out report.html

The same run as the Grid tab's (`app.domain.grid`), for a GPU box without a browser. `--out` ends in
.html (a self-contained report), .csv or .json; the run's state is always written beside it as
`<name>.grid.json`, so an interrupted run (Ctrl-C) goes on with `--resume`, answering only the
cells not done. Every engine setting (`APP_*` variables and their flags) applies.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

from app.catalog.cards import CardError, ModelCard, load_cards
from app.config import Settings, SettingsError, add_flags, from_command_line
from app.engines.base import SamplingSettings

if TYPE_CHECKING:  # vLLM and the media pipeline are imported only to run
    from app.domain.grid import GridRun
    from app.domain.promptsets import PromptSet
    from app.media.loading import VideoDecoderPool

PROGRESS_EVERY_S = 2.0
STOPPED = 130  # a run stopped by Ctrl-C, as shells report SIGINT


class EvalError(ValueError):
    """Arguments that cannot run; one line for the user."""


def parser() -> argparse.ArgumentParser:
    parse = argparse.ArgumentParser(prog="python -m app eval", description=__doc__.splitlines()[0])
    parse.add_argument("--set", required=True, type=Path, help="the prompt set: a .jsonl or .csv file")
    parse.add_argument(
        "--media", type=Path, help="the set's files: a folder or a .zip (default: the set's folder)"
    )
    parse.add_argument("--out", required=True, type=Path, help="the report: .html, .csv or .json")
    parse.add_argument("--resume", action="store_true", help="go on with the run stored beside --out")
    parse.add_argument("--temperature", type=float, help="default: each model's own")
    parse.add_argument("--top-p", type=float, help="default: each model's own")
    parse.add_argument("--max-tokens", type=int, help="default: each model's own")
    parse.add_argument("--seed", type=int, help="default: random")
    # Among the settings' flags, --models (APP_MODELS, the models offered) names the run's models.
    add_flags(parse)
    return parse


def state_path(out: Path) -> Path:
    return out.with_name(out.stem + ".grid.json")


def chosen_cards(wanted: tuple[str, ...], cards: dict[str, ModelCard], settings: Settings) -> list[ModelCard]:
    from app.domain.grid import MAX_MODELS, MIN_MODELS

    if not MIN_MODELS <= len(set(wanted)) == len(wanted) <= MAX_MODELS:
        raise EvalError(
            f"--models takes {MIN_MODELS} to {MAX_MODELS} different card keys; got {len(wanted)}."
        )
    chosen = []
    for key in wanted:
        if key not in cards:
            raise EvalError(f"--models: no card {key!r} (`python -m app --list` shows the keys).")
        card = cards[key]
        availability = card.availability(
            settings.gpu_count, settings.allow_remote_code, key in settings.remote_engines
        )
        if not availability.available:
            raise EvalError(f"--models: {card.display_name} cannot run here: {availability.reason}.")
        chosen.append(card)
    return chosen


async def evaluate(args: argparse.Namespace, settings: Settings, cards: list[ModelCard]) -> int:
    from app.domain import grid
    from app.domain.promptsets import check_set, read_set
    from app.engines.manager import EngineManager
    from app.engines.vllm_engine import VllmEngineFactory
    from app.media.loading import VideoDecoderPool

    prompt_set = read_set(args.set, args.media)
    decoder = VideoDecoderPool(workers=1)
    by_key = {card.key: card for card in cards}
    manager = EngineManager(by_key, settings, VllmEngineFactory(settings))
    sampling = SamplingSettings(
        temperature=args.temperature, top_p=args.top_p, max_tokens=args.max_tokens, seed=args.seed
    )
    state = state_path(args.out)
    try:
        checked = await check_set(prompt_set, cards, decoder)
        for line in checked.refused:
            print(f"refused: {line}", file=sys.stderr)
        if not checked.any_runnable:
            raise EvalError("No item of the set can run on these models (see the refusals above).")
        if args.resume and state.is_file():
            run = grid.from_json(state.read_text(encoding="utf-8"), by_key)
            if run.models != [card.key for card in cards]:
                raise EvalError(
                    f"{state.name} ran other models ({','.join(run.models)}); give those to --models."
                )
        else:
            names = {card.key: card.display_name for card in cards}
            run = grid.GridRun(prompt_set.name, prompt_set.items, [c.key for c in cards], names, sampling)
        print(
            f"{run.done} of {run.total} answers already there" if run.done else run.progress(),
            file=sys.stderr,
        )
        stopped = False
        last = 0.0
        # The drawn boxes live until the report (which holds them inline) is written.
        with tempfile.TemporaryDirectory(prefix="vlm-playground-boxes-") as boxes:
            updates = grid.run_grid(run, prompt_set, by_key, checked, manager, decoder, boxes=Path(boxes))
            try:
                async with contextlib.aclosing(updates):
                    async for _ in updates:
                        if time.monotonic() - last > PROGRESS_EVERY_S:
                            print(run.progress(), file=sys.stderr)
                            last = time.monotonic()
            except asyncio.CancelledError:  # Ctrl-C: asyncio.run cancels this task
                stopped = True
                task = asyncio.current_task()
                if task is not None:
                    task.uncancel()  # handled here: what follows (writing, closing) runs normally
            write_outputs(run, prompt_set, decoder, args.out)
        if stopped:
            print(
                f"stopped: {run.done} of {run.total} answers kept; run again with --resume", file=sys.stderr
            )
            return STOPPED
        print(f"{run.progress()}; wrote {args.out} and {state.name}", file=sys.stderr)
        return 0
    finally:
        prompt_set.close()
        await manager.close()
        decoder.close()


def write_outputs(run: GridRun, prompt_set: PromptSet, decoder: VideoDecoderPool, out: Path) -> None:
    from app.domain import grid

    out.parent.mkdir(parents=True, exist_ok=True)
    text = grid.to_json(run)
    state_path(out).write_text(text, encoding="utf-8")
    suffix = out.suffix.lower()
    if suffix == ".html":
        out.write_text(grid.to_html(run, grid.thumbnails(run, prompt_set, decoder)), encoding="utf-8")
    elif suffix == ".csv":
        out.write_text(grid.to_csv(run), encoding="utf-8")
    else:
        out.write_text(text, encoding="utf-8")


def main(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    try:
        if args.out.suffix.lower() not in (".html", ".csv", ".json"):
            raise EvalError("--out must end in .html, .csv or .json.")
        settings = from_command_line(args)
        from app.demo.models import offered, with_demo_models

        catalog = offered(with_demo_models(load_cards(settings.cards_dir), settings), settings)
        if not args.models:
            raise EvalError("--models is needed: 2 to 8 card keys separated by commas.")
        cards = chosen_cards(settings.models, catalog, settings)
        if settings.gpu_count == 0:
            from app.demo.models import default_demo_dir, use_local_vllm_environment

            use_local_vllm_environment((settings.demo_dir or default_demo_dir()).parent / "vllm")
        os.environ.setdefault("VLLM_RPC_BASE_PATH", tempfile.gettempdir())
        # The progress lines, not the engines' start-up log (VLLM_LOGGING_LEVEL=INFO shows it).
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
        return asyncio.run(evaluate(args, settings, cards))
    except KeyboardInterrupt:
        return STOPPED
    except (EvalError, CardError, SettingsError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except json.JSONDecodeError as error:
        print(f"error: the stored run could not be read ({error.msg}); run without --resume", file=sys.stderr)
        return 2
    except ValueError as error:  # a prompt set that cannot be read (PromptSetError)
        print(f"error: {error}", file=sys.stderr)
        return 2
