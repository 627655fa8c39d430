"""Trains the seeing demo model into `static/seeing-model` (the weights the app serves), from
the fixed seed in `app.demo.seeing_model`, then reports its accuracy per question kind on held-out
questions through the real vLLM engine:

    .venv/bin/python scripts/train_seeing_model.py [--out DIR] [--per-kind N]

About 9 minutes on two CPU cores, and a minute to evaluate. The tests train it again from the
same code and check that the result still answers right (`tests/test_seeing.py`).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from app.catalog.cards import load_cards  # noqa: E402
from app.demo.models import SEEING_FOLDER, use_local_vllm_environment  # noqa: E402
from app.demo.seeing_check import answers, foreign_set, readme_example, tally, wrong_answers  # noqa: E402
from app.demo.seeing_model import (  # noqa: E402
    BASE_CARD,
    SEEING_KEY,
    STEPS,
    Steps,
    accuracy,
    build_seeing_model,
    seeing_card,
)

# Not training's seed, nor the tests': questions about pictures no run has seen.
EVALUATION_SEED = 31
FOREIGN = ROOT / "tests" / "data" / "foreign-shapes"


def evaluate(folder: Path, per_kind: int) -> None:
    """The model in `folder` asked `per_kind` held-out questions of each kind, the foreign set and
    the README example, through the app's engine manager and the real vLLM engine (greedy);
    prints the share right per kind, and the foreign set's wrong answers."""
    use_local_vllm_environment(Path(tempfile.mkdtemp(prefix="vllm-seeing-")))
    from app.config import Settings
    from app.engines.manager import EngineManager
    from app.engines.vllm_engine import VllmEngineFactory
    from app.media.loading import VideoDecoderPool

    settings = Settings(gpu_count=0, cpu_kv_cache_bytes=64 * 2**20)
    card = seeing_card(load_cards()[BASE_CARD], folder)
    decoder = VideoDecoderPool(workers=1)

    async def run() -> None:
        manager = EngineManager({SEEING_KEY: card}, settings, VllmEngineFactory(settings))
        try:
            scores = await accuracy(manager, SEEING_KEY, per_kind, EVALUATION_SEED)
            print(f"held-out accuracy ({per_kind} questions of each kind, seed {EVALUATION_SEED}):")
            for kind, score in scores.items():
                print(f"  {kind:12} {score:.0%}")
            questions = foreign_set(FOREIGN) + readme_example()
            said = await answers(manager, SEEING_KEY, decoder, questions)
            print(f"foreign set ({FOREIGN.relative_to(ROOT)}) and the README example:")
            for kind, (right, asked) in tally(questions, said).items():
                print(f"  {kind:12} {right}/{asked} = {right / asked:.0%}")
            for line in wrong_answers(questions, said):
                print(f"  wrong: {line}")
        finally:
            await manager.close()

    asyncio.run(run())
    decoder.close()
    gc.collect()  # the engine's objects go now, not at exit (where their shutdown fails noisily)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=SEEING_FOLDER, help="where the model goes")
    parser.add_argument("--vision-steps", type=int, default=STEPS.vision, help="steps of the vision lesson")
    parser.add_argument("--answer-steps", type=int, default=STEPS.answers, help="steps of the answers lesson")
    parser.add_argument("--per-kind", type=int, default=100, help="held-out questions per kind (0: none)")
    parser.add_argument("--evaluate-only", action="store_true", help="evaluate the model in --out")
    args = parser.parse_args()
    if not args.evaluate_only:
        started = time.monotonic()
        scratch = args.out.parent / f".{args.out.name}-training"
        shutil.rmtree(scratch, ignore_errors=True)
        steps = Steps(args.vision_steps, args.answer_steps)
        folder = build_seeing_model(
            scratch, load_cards()[BASE_CARD], steps, report=lambda line: print(line, flush=True)
        )
        shutil.rmtree(args.out, ignore_errors=True)
        # With the stamp of the code that made them: the tests use these weights instead of
        # training again until the training or the data generator changes.
        shutil.copytree(folder, args.out)
        shutil.rmtree(scratch)
        print(f"trained in {time.monotonic() - started:.0f} s into {args.out}", flush=True)
    if args.per_kind:
        evaluate(args.out, args.per_kind)


if __name__ == "__main__":
    main()
