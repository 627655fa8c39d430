"""Trains a seeing demo model into the folder the app serves it from, from its fixed seed, then
reports its accuracy per question kind on held-out questions, the foreign set (asked first, and as
the third question of a visitor's chat about its picture), the README's example, tidy rows of
three shapes as the page's example picture and the pictures of a third hand, through the real vLLM
engine:

    .venv/bin/python scripts/train_seeing_model.py [--model first|second] [--out DIR] [--per-kind N]

`first` (the default): the tiny Qwen3-VL of `app.demo.seeing_model`, into `static/seeing-model`
(about 85 minutes on two CPU cores unpinned, the vision lesson about 40 and lessons two to four 44
in run FU2; about 137 with the arithmetic pinned in run PW, below). `second`: the tiny LLaVA-1.5 of
`app.demo.seeing_llava`, into `static/seeing-model-llava` (about 11 minutes unpinned, 33 pinned in
run LP).
Evaluating takes a minute or two. The tests train again from the same code where the committed
weights' stamp no longer matches it (`tests/test_seeing.py`, `tests/test_seeing_second.py`).
`--second-lesson-from DIR` runs only the first model's lessons two to four, on the tower of a saved
model (its first lesson's, which the later ones leave as it is; the committed model's will do),
`--third-lesson-from DIR` its third and fourth, on a model saved after its first two, and
`--fourth-lesson-from DIR` its fourth alone, on one saved after three (`later_lesson`).
`--answers-seed K` gives lesson two the seed `SEED + K` instead of the recipe's (the notebook's runs
of other seeds: `docs/SEEING_MODEL_RUNS.md`); weights of a seed other than the recipe's are
stamped with it. It trains with the arithmetic pinned (`app.demo.numerics`: it starts itself again
with the pins), so that one seed should make the same weights on any x86-64 machine with AVX2
(its vision lesson made byte for byte on two AMD CPUs, one with AVX-512 and one without; `make
test` checks a few steps against recorded bytes: docs/SEEING_MODEL_RUNS.md).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import gc
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from app.catalog.cards import ModelCard, load_cards  # noqa: E402
from app.demo import numerics, seeing_llava, seeing_model  # noqa: E402
from app.demo.models import SECOND_FOLDER, SEEING_FOLDER, use_local_vllm_environment  # noqa: E402
from app.demo.seeing_check import (  # noqa: E402
    FOREIGN_KINDS,
    STRANGER_PICTURES,
    answers,
    answers_in_a_chat,
    by_wording,
    foreign_set,
    labelled_as_asked,
    one_colour_rows,
    readme_example,
    rows_of_three,
    stranger_questions,
    tally,
    wrong_answers,
)
from app.demo.seeing_model import Steps  # noqa: E402

# Not training's seed, nor the tests': questions about pictures no run has seen.
EVALUATION_SEED = 31
FOREIGN = ROOT / "tests" / "data" / "foreign-shapes"
# Pictures of a third hand (`scripts/make_third_hand_eval.py`), never used to tune a run: where
# two runs differ on the foreign set, this says whether the difference carries to other pictures.
THIRD_HAND = ROOT / "tests" / "data" / "third-hand-shapes"


@dataclass(frozen=True)
class Recipe:
    """One seeing model: its key, the catalog card it takes its format from, how its card is
    made, how it is trained, its steps, where the app serves it from, its held-out test, the
    kinds it is trained on and those of the foreign set it is asked."""

    key: str
    base: str
    card: Callable[[ModelCard, Path], ModelCard]
    build: Callable[..., Path]
    steps: Steps
    folder: Path
    accuracy: Callable[..., Any]
    kinds: tuple[str, ...]
    foreign_kinds: frozenset[str]


RECIPES = {
    "first": Recipe(
        seeing_model.SEEING_KEY,
        seeing_model.BASE_CARD,
        seeing_model.seeing_card,
        seeing_model.build_seeing_model,
        seeing_model.STEPS,
        SEEING_FOLDER,
        seeing_model.accuracy,
        seeing_model.KINDS,
        FOREIGN_KINDS,
    ),
    "second": Recipe(
        seeing_llava.SECOND_KEY,
        seeing_llava.SECOND_BASE_CARD,
        seeing_llava.second_card,
        seeing_llava.build_second_model,
        seeing_llava.SECOND_STEPS,
        SECOND_FOLDER,
        seeing_llava.accuracy,
        seeing_llava.SECOND_KINDS,
        # Less what it is not taught that the first is: boxes (LLaVA-1.5 has no grounding syntax) and
        # a shape named among several (it has no third lesson).
        FOREIGN_KINDS - (set(seeing_model.KINDS) - set(seeing_llava.SECOND_KINDS)),
    ),
}


def evaluate(recipe: Recipe, folder: Path, per_kind: int) -> None:
    """The model in `folder` asked `per_kind` held-out questions of each kind, the foreign set, the
    README example, wordings training never uses and the foreign set again as a chat's third
    question (`seeing_check.answer_in_a_chat`), through the app's engine manager and the
    real vLLM engine (greedy); prints the share right per kind, and the wrong answers on the
    foreign set, the rows and the wordings training never uses."""
    use_local_vllm_environment(Path(tempfile.mkdtemp(prefix="vllm-seeing-")))
    from app.config import Settings
    from app.engines.manager import EngineManager
    from app.engines.vllm_engine import VllmEngineFactory
    from app.media.loading import VideoDecoderPool

    settings = Settings(gpu_count=0, cpu_kv_cache_bytes=64 * 2**20)
    card = recipe.card(load_cards()[recipe.base], folder)
    decoder = VideoDecoderPool(workers=1)

    async def run() -> None:
        manager = EngineManager({recipe.key: card}, settings, VllmEngineFactory(settings))
        try:
            scores = await recipe.accuracy(manager, recipe.key, per_kind, EVALUATION_SEED)
            print(f"held-out accuracy ({per_kind} questions of each kind, seed {EVALUATION_SEED}):")
            for kind, score in scores.items():
                print(f"  {kind:12} {score:.0%}")
            asked = [q for q in foreign_set(FOREIGN) if q.kind in recipe.foreign_kinds] + readme_example()
            said = await answers(manager, recipe.key, decoder, asked)
            print(f"foreign set ({FOREIGN.relative_to(ROOT)}) and the README example:")
            for kind, (right, count) in tally(asked, said).items():
                print(f"  {kind:12} {right}/{count} = {right / count:.0%}")
            if "box" in recipe.kinds:
                print("  box labels as asked: {}/{}".format(*labelled_as_asked(asked, said)))
            for line in wrong_answers(asked, said):
                print(f"  wrong: {line}")
            for rows_of, title in (
                (rows_of_three, "tidy rows of three, as the page's example picture"),
                (one_colour_rows, "the same rows with their three shapes in one colour"),
            ):
                with tempfile.TemporaryDirectory(prefix="rows-") as rows:
                    asked = [q for q in rows_of(Path(rows)) if q.kind.split()[-1] in recipe.kinds]
                    said = await answers(manager, recipe.key, decoder, asked)
                pictures = len({q.files for q in asked})
                print(f"{title} ({pictures} pictures):")
                for kind, (right, count) in tally(asked, said).items():
                    print(f"  {kind:24} {right}/{count} = {right / count:.0%}")
                for line in wrong_answers(asked, said):
                    print(f"  wrong: {line}")
            asked = [q for q in foreign_set(THIRD_HAND) if q.kind in recipe.foreign_kinds]
            said = await answers(manager, recipe.key, decoder, asked)
            print(f"a third hand ({THIRD_HAND.relative_to(ROOT)}), to choose between runs:")
            for kind, (right, count) in tally(asked, said).items():
                print(f"  {kind:12} {right}/{count} = {right / count:.0%}")
            strangers = [q for q in stranger_questions(FOREIGN) if q.kind in recipe.kinds]
            said = await answers(manager, recipe.key, decoder, strangers)
            print(f"wordings training never uses, on the foreign set's pictures ({STRANGER_PICTURES} each):")
            for wording, (right, count) in tally(strangers, said, by_wording).items():
                print(f"  {wording:50} {right}/{count}")
            for line in wrong_answers(strangers, said):
                print(f"  wrong: {line}")
            asked = [q for q in foreign_set(FOREIGN) if q.kind in recipe.foreign_kinds] + readme_example()
            said = await answers_in_a_chat(manager, recipe.key, decoder, asked)
            print("the foreign set and the README example, each the third question of a chat about it:")
            for kind, (right, count) in tally(asked, said).items():
                print(f"  {kind:12} {right}/{count} = {right / count:.0%}")
        finally:
            await manager.close()

    asyncio.run(run())
    decoder.close()
    gc.collect()  # the engine's objects go now, not at exit (where their shutdown fails noisily)


def printed(line: str) -> None:
    """How the training reports its progress: a line on the output at once."""
    print(line, flush=True)


def later_lesson(
    lesson: str, source: Path, out: Path, steps: Steps, answers_seed: int = seeing_model.ANSWERS_SEED
) -> None:
    """The first model's lessons from `lesson` on ("answers", "named" or "boxes"), on a model
    saved before it: what the whole recipe does from there (it rounds the weights to bfloat16, as
    saved, and gives each of these lessons its own seed), without the vision lesson's 40 minutes.
    From "answers", only the saved model's tower is taken (`seeing_model.taught_in_vision_lesson`); the text
    model is the seed's, as the whole recipe's is after its first lesson. The third lesson was
    made so from run L's weights, which are in git (`git show
    2f69afd:static/seeing-model/model.safetensors`), and the fourth from run U's (`git show
    cc0464a:static/seeing-model/model.safetensors`); with 20 steps of each lesson, this and the
    whole recipe gave the same bytes."""
    import torch
    from transformers import AutoConfig, AutoProcessor, Qwen3VLForConditionalGeneration

    shutil.copytree(source, out)
    processor = AutoProcessor.from_pretrained(source)
    processor.tokenizer.padding_side = "right"  # as `seeing_model.train` trains
    model = Qwen3VLForConditionalGeneration.from_pretrained(source, dtype=torch.float32)
    card = seeing_model.seeing_card(load_cards()[seeing_model.BASE_CARD], out)
    if lesson == "answers":
        saved = model
        torch.manual_seed(seeing_model.SEED)  # as `seeing_model.train` makes the model
        model = Qwen3VLForConditionalGeneration(AutoConfig.from_pretrained(source))
        tower = {
            name: value
            for name, value in saved.model.visual.state_dict().items()
            if seeing_model.taught_in_vision_lesson(name)
        }
        missing, unexpected = model.model.visual.load_state_dict(tower, strict=False)
        if unexpected or any(seeing_model.taught_in_vision_lesson(name) for name in missing):
            raise RuntimeError(f"the tower in {source} is not this recipe's: {unexpected or missing}")
    seeing_model.train_after_vision(model, processor, card, steps, printed, lesson, answers_seed)
    model.to(torch.bfloat16).save_pretrained(out)
    # The whole recipe writes its config before training; loading in float32 adds a dtype per part.
    shutil.copy(source / "config.json", out / "config.json")
    (out / seeing_model.MARKER).write_text(json.dumps(seeing_model.training_stamp(steps, answers_seed)))


def answers_seed(source: Path, lesson: str, offset: int | None) -> int:
    """Lesson two's seed: `SEED + offset` where lesson two runs and an offset is given; after it,
    that of the saved model's own lesson two (in its stamp), so that a later lesson's stamp says it."""
    if lesson == "answers":
        return seeing_model.ANSWERS_SEED if offset is None else seeing_model.SEED + offset
    return int(seeing_model.stamp_of(source).get("answers_seed", seeing_model.ANSWERS_SEED))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=sorted(RECIPES), default="first", help="which seeing model")
    parser.add_argument(
        "--out", type=Path, help="where the model goes (default: where the app serves it from)"
    )
    parser.add_argument("--vision-steps", type=int, help="steps of the vision lesson")
    parser.add_argument("--answer-steps", type=int, help="steps of the answers lesson")
    parser.add_argument("--named-steps", type=int, help="steps of the first model's third lesson")
    parser.add_argument("--box-steps", type=int, help="steps of the first model's fourth lesson")
    parser.add_argument(
        "--second-lesson-from",
        type=Path,
        metavar="DIR",
        help="the first model: run only its lessons two to four, on the tower of the model in DIR",
    )
    parser.add_argument(
        "--third-lesson-from",
        type=Path,
        metavar="DIR",
        help="the first model: run only its third and fourth lessons, on the model in DIR (saved after two)",
    )
    parser.add_argument(
        "--fourth-lesson-from",
        type=Path,
        metavar="DIR",
        help="the first model: run only its fourth lesson, on the model in DIR (saved after three)",
    )
    parser.add_argument(
        "--answers-seed",
        type=int,
        metavar="K",
        help="with --second-lesson-from: lesson two's seed SEED + K "
        f"(the recipe's: K = {seeing_model.ANSWERS_SEED - seeing_model.SEED})",
    )
    parser.add_argument("--per-kind", type=int, default=100, help="held-out questions per kind (0: none)")
    parser.add_argument("--evaluate-only", action="store_true", help="evaluate the model in --out")
    args = parser.parse_args()
    recipe = RECIPES[args.model]
    out = args.out or recipe.folder
    if args.answers_seed is not None and (args.second_lesson_from is None or args.evaluate_only):
        # The whole recipe's lesson two keeps its seed: the weights it makes are the app's.
        parser.error("--answers-seed needs --second-lesson-from (lesson two on a saved model's tower)")
    if not args.evaluate_only:
        started = time.monotonic()
        scratch = out.parent / f".{out.name}-training"
        shutil.rmtree(scratch, ignore_errors=True)
        given = {
            "vision": args.vision_steps,
            "answers": args.answer_steps,
            "named": args.named_steps,
            "boxes": args.box_steps,
        }
        steps = dataclasses.replace(recipe.steps, **{k: v for k, v in given.items() if v is not None})
        if steps.vision < 1 or steps.answers < 1 or steps.named < 0 or steps.boxes < 0:
            # Refused before training: an answers lesson of no steps failed after the whole
            # vision lesson, with nothing saved.
            parser.error("--vision-steps and --answer-steps take 1 or more, the later lessons' 0 or more")
        if not numerics.pinned():
            if os.environ.get(numerics.REPLACED):
                raise RuntimeError("started again with the training's pins, and they were not kept")
            # torch reads a pin as it loads: this script again, from its start, with the pins.
            started_again(numerics.pinned_environ(), sys.orig_argv[1:])
        numerics.pin_torch(printed)
        later = {
            "answers": args.second_lesson_from,
            "named": args.third_lesson_from,
            "boxes": args.fourth_lesson_from,
        }
        if any(later.values()):
            if recipe.key != seeing_model.SEEING_KEY:
                parser.error("only the first model's later lessons can be run on their own")
            lesson, source = next((lesson, source) for lesson, source in later.items() if source)
            if source.resolve() == out.resolve():
                # `out` is emptied first: the model to start from would be deleted.
                parser.error(f"--out must be another folder than {source}")
            shutil.rmtree(out, ignore_errors=True)
            later_lesson(lesson, source, out, steps, answers_seed(source, lesson, args.answers_seed))
            print(f"{lesson} lesson on in {time.monotonic() - started:.0f} s into {out}", flush=True)
            if args.per_kind:
                evaluate_as_served(args.model, out, args.per_kind)
            return
        folder = recipe.build(scratch, load_cards()[recipe.base], steps, report=printed)
        shutil.rmtree(out, ignore_errors=True)
        # With the stamp of the code that made them: the tests use these weights instead of
        # training again until the training or the data generator changes.
        shutil.copytree(folder, out)
        shutil.rmtree(scratch)
        print(f"trained in {time.monotonic() - started:.0f} s into {out}", flush=True)
    if args.per_kind:
        if args.evaluate_only:
            evaluate(recipe, out, args.per_kind)
        else:
            evaluate_as_served(args.model, out, args.per_kind)


def started_again(environ: dict[str, str], arguments: list[str]) -> None:
    """This script, from its start, in this process, with `environ` and `arguments`: the same
    interpreter (a bare `python` that names another would lose the virtual environment)."""
    os.execve(sys.executable, [sys.executable, *arguments], environ)  # noqa: S606 (this script)


def evaluate_as_served(model: str, out: Path, per_kind: int) -> None:
    """`evaluate`, in this script started again without the training's pins: the app serves with
    torch's kernels, threads and oneDNN as the machine has them, and the processor's resizing in
    this process and the engines' arithmetic are then the same as the app's."""
    environ = dict(os.environ)
    numerics.unpin(environ)
    arguments = ["--model", model, "--out", str(out), "--per-kind", str(per_kind), "--evaluate-only"]
    started_again(environ, [str(Path(__file__).resolve()), *arguments])


if __name__ == "__main__":
    main()
