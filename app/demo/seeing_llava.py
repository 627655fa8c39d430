"""The second seeing demo model: a tiny LLaVA-1.5 trained here on the same drawings as the first
(`app.demo.seeing_model`, a tiny Qwen3-VL), smaller and trained less, so that a CPU machine has
two models worth comparing: both answer about shapes, and they differ measurably (accuracy per
kind of question for each in `docs/BENCHMARKS.md`). Compare and the arena offer these two where
the demo models serve (issue 29, item 8).

Another architecture and prompt format than the first: a CLIP tower of fixed size (every picture
is resized to 128x128 pixels, no crop, so nothing at a side is cut off; 64 tokens of 16x16
pixels, each with a learned position) and a Llama, prompted "USER: <image>\\n... ASSISTANT:".
It takes pictures only (LLaVA-1.5 takes no video) and has no grounding syntax, so it answers
every kind of question the first does but clips, boxes and one shape named among several (which
the first learns in a third lesson this one does not have).

It is trained in the first model's first two lessons (its labels per token, its questions, its
vocabulary, its loop), with its own code where the architectures differ. The first model's module
is reused, not changed: its source is part of the stamp of its committed weights.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import random
import shutil
import sys
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from app.catalog.cards import ModelCard
from app.demo import seeing_model, shapes
from app.demo.seeing_model import (
    ANSWER_LEARNING_RATE,
    ANSWER_TOKENS,
    BATCH,
    KIND_WEIGHTS,
    MARKER,
    PLACE_KINDS,
    PLACES_FIRST,
    PROBES,
    SEED,
    VISION_LEARNING_RATE,
    Steps,
    ask,
    lesson_scene,
    lesson_targets,
    made_by,
    probes_loss,
    right_answer,
    train_loop,
    vocabulary_text,
)
from app.demo.shapes import KINDS, NAMED_KINDS, Example, example
from app.engines.manager import EngineManager

SECOND_KEY = "demo_seeing_llava"
SECOND_BASE_CARD = "llava"
SECOND_VERSION = 1
# Clips and boxes are the first model's alone: LLaVA-1.5 takes no video and writes no boxes. So
# is one shape named among several, taught in a third lesson this model, trained less, has not.
SECOND_KINDS = tuple(kind for kind in KINDS if kind not in ("box", "start", "end", "moved", *NAMED_KINDS))
# Trained less than the first (12,000 and 3,000 steps): about 0.07 s and 0.15 s a step on two cores.
SECOND_STEPS = Steps(vision=2000, answers=3500)
# The first model's weights per kind, and twice for the colour questions: with them once, the
# first training answered "white" (a background's word) to most colour questions (36% right).
SECOND_WEIGHTS = {**KIND_WEIGHTS, "colour": 2, "first": 2, "second": 2}
IMAGE_SIZE, PATCH_SIZE = 128, 16
GRID = IMAGE_SIZE // PATCH_SIZE  # 8x8 tokens, each 16x16 pixels of the resized picture
# Three layers of width 128 (the first model's tower has four), the last one's output used.
VISION = {
    "model_type": "clip_vision_model",
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "image_size": IMAGE_SIZE,
    "patch_size": PATCH_SIZE,
    "projection_dim": 128,
}
TEXT_LAYERS = 4
END = "</s>"


def second_card(base: ModelCard, folder: Path) -> ModelCard:
    """The LLaVA-1.5 card (`SECOND_BASE_CARD`), served from the trained model in `folder`."""
    fields = base.model_dump()
    args = dict(fields["reference_engine_args"])
    args.update(model=str(folder))
    fields.update(
        key=SECOND_KEY,
        display_name="Shapes too, smaller: tiny LLaVA trained here",
        family="Demo",
        hf_repo=str(folder),
        made_here="a tiny LLaVA-1.5 trained by this project on drawings of shapes (app.demo.seeing_llava)",
        reference=(
            f"trained by app.demo.seeing_llava on app.demo.shapes (seed {SEED}); prompt format of {base.key}"
        ),
        reference_engine_args=args,
        sampling_defaults={"temperature": 0.0, "max_tokens": ANSWER_TOKENS},
        runs_on_cpu=True,
        hardware="Runs anywhere, CPU included: about 3 MB.",
        notes=(
            "A tiny LLaVA-1.5 trained on this machine on the same drawings of shapes as the "
            "Qwen3-VL demo model, smaller and trained less: it answers the same questions about "
            "pictures (colour, kind, place, how many, which is bigger, the background, a "
            "sentence, the first or second of two pictures), less often right, and no clips "
            "or boxes. Anything else gets a sentence saying what it can answer."
        ),
    )
    return ModelCard.model_validate(fields)


def training_stamp(steps: Steps = SECOND_STEPS) -> dict[str, Any]:
    """What the trained model was made by: its version and steps, and the hash of the data
    generator's, the first model's (whose lessons it shares) and this module's source."""
    modules = (shapes, seeing_model, sys.modules[__name__])
    sources = b"".join(Path(module.__file__ or "").read_bytes() for module in modules)
    return {
        "version": SECOND_VERSION,
        "steps": asdict(steps),
        "sources": hashlib.sha256(sources).hexdigest(),
    }


def build_second_model(
    root: Path,
    base: ModelCard,
    steps: Steps = SECOND_STEPS,
    report: Callable[[str], None] = seeing_model.log.info,
    committed: Path | None = None,
) -> Path:
    """The trained model: `committed` where it carries this code's stamp, else trained once
    under `root` (cached by the same stamp)."""
    stamp = training_stamp(steps)
    if committed is not None and made_by(committed, stamp):
        return Path(committed)
    folder = Path(root) / SECOND_KEY
    if made_by(folder, stamp):
        return folder
    if folder.exists():
        shutil.rmtree(folder)
    train(folder, base, steps, report)
    (folder / MARKER).write_text(json.dumps(stamp))
    return folder


def train(folder: Path, base: ModelCard, steps: Steps, report: Callable[[str], None]) -> None:
    import torch
    from transformers import AutoConfig, AutoProcessor, CLIPImageProcessor, LlavaForConditionalGeneration

    from app.demo.twins import build_twin
    from app.demo.twins.common import train_tokenizer

    twin = build_twin(base, folder.parent / "twins")
    shutil.copytree(twin, folder)
    (folder / "twin.json").unlink(missing_ok=True)
    processor = AutoProcessor.from_pretrained(folder)
    special = ["<unk>", "<s>", "</s>", "<image>", "<pad>"]
    tokenizer = train_tokenizer(
        special,
        eos=END,
        bos="<s>",
        unk="<unk>",
        pad="<pad>",
        text=[*vocabulary_text(), "USER: ASSISTANT:"],
    )
    if tokenizer.convert_tokens_to_ids(special) != processor.tokenizer.convert_tokens_to_ids(special):
        raise RuntimeError("the retrained tokenizer moved the special tokens")
    processor.tokenizer = tokenizer
    # Squeezed to a square, not cropped: a shape at a side of a wide picture stays in it.
    processor.image_processor = CLIPImageProcessor(
        size={"height": IMAGE_SIZE, "width": IMAGE_SIZE},
        do_center_crop=False,
        image_mean=[0.5] * 3,
        image_std=[0.5] * 3,
    )
    processor.patch_size = PATCH_SIZE
    processor.num_additional_image_tokens = 1  # CLIP's class token, which the default strategy drops
    processor.save_pretrained(folder)
    processor.tokenizer.padding_side = "right"
    card = second_card(base, folder)

    config = AutoConfig.from_pretrained(folder)
    config.vision_config = type(config.vision_config)(**VISION)
    config.vision_feature_layer = -1
    config.text_config.num_hidden_layers = TEXT_LAYERS
    config.text_config.vocab_size = len(tokenizer)
    config.save_pretrained(folder)
    torch.manual_seed(SEED)
    model = LlavaForConditionalGeneration(config)
    rng = random.Random(SEED + 1)  # noqa: S311 (training data, seeded to be reproducible)
    teach_vision(model, processor, rng, steps.vision, report)
    teach_answers(model, processor, card, rng, steps.answers, report)
    model.to(torch.bfloat16).save_pretrained(folder)
    name_tower_as_released(folder / "model.safetensors")


def name_tower_as_released(weights: Path) -> None:
    """Names the CLIP tower's weights as the released LLaVA-1.5 checkpoints do
    (`vision_tower.vision_model.*`), which vLLM loads; transformers 5 saves them one level up."""
    from safetensors.torch import load_file, save_file

    tensors = load_file(weights)
    prefix, released = "vision_tower.", "vision_tower.vision_model."
    # Names already as released stay: a transformers that saves them so, or a second run over
    # the same file, must not make `vision_tower.vision_model.vision_model.*`.
    renamed = {
        (
            f"{released}{name[len(prefix) :]}"
            if name.startswith(prefix) and not name.startswith(released)
            else name
        ): tensor
        for name, tensor in tensors.items()
    }
    save_file(renamed, weights, metadata={"format": "pt"})


def picture_features(model: Any, pixels: Any) -> Any:
    """The projected tokens of a batch of pictures, as the text model gets them: (tokens, width)."""
    import torch

    features = model.model.get_image_features(
        pixels, vision_feature_layer=-1, vision_feature_select_strategy="default"
    ).pooler_output
    return torch.cat(list(features))


def teach_vision(
    model: Any, processor: Any, rng: random.Random, steps: int, report: Callable[[str], None]
) -> None:
    """Lesson one, as the first model's (`seeing_model.teach_vision`): a linear probe per label on
    every token out of the tower and projector (dropped afterwards)."""
    import torch

    width = model.config.text_config.hidden_size
    probes = torch.nn.ModuleDict({name: torch.nn.Linear(width, size) for name, size in PROBES.items()})
    parameters = [*model.model.vision_tower.parameters(), *model.model.multi_modal_projector.parameters()]
    parameters += list(probes.parameters())
    model.train()

    def loss_of_batch() -> Any:
        scenes = [lesson_scene(rng) for _ in range(BATCH)]
        pixels = processor.image_processor(images=[s.image for s in scenes], return_tensors="pt")
        features = picture_features(model, pixels["pixel_values"])
        return probes_loss(probes, features, lesson_targets(scenes, [(GRID, GRID)] * len(scenes)))

    train_loop("vision", parameters, loss_of_batch, steps, VISION_LEARNING_RATE, report)


def teach_answers(
    model: Any, processor: Any, card: ModelCard, rng: random.Random, steps: int, report: Callable[[str], None]
) -> None:
    """Lesson two: the text model learns to answer, places first, on conversations rendered by
    the card's prompt format; the tower and projector stay as lesson one left them (the tokens
    its probes read), as the first model's tower does."""
    model.train()
    seeing = (model.model.vision_tower, model.model.multi_modal_projector)
    for part in seeing:
        part.requires_grad_(False)
    parameters = [p for p in model.parameters() if p.requires_grad]
    kinds = list(SECOND_KINDS)
    weights = [SECOND_WEIGHTS.get(kind, 1) for kind in kinds]
    places = [kind for kind in PLACE_KINDS if kind in kinds]
    done = [0]

    def loss_of_batch() -> Any:
        first = done[0] < steps * PLACES_FIRST
        done[0] += 1
        items = [
            example(rng, rng.choice(places) if first else rng.choices(kinds, weights)[0])
            for _ in range(BATCH)
        ]
        return model(**model_inputs(processor, card, items)).loss

    train_loop("answers", parameters, loss_of_batch, steps, ANSWER_LEARNING_RATE, report)
    for part in seeing:
        part.requires_grad_(True)


def model_inputs(processor: Any, card: ModelCard, items: list[Example]) -> dict[str, Any]:
    """A training batch: each conversation rendered by the card's prompt format, as the app
    renders it (several pictures in one turn through the processor's chat template), with its
    answer; loss on the answer only."""
    import torch

    from app.catalog.adapters import render

    texts, images, answer_lengths = [], [], []
    for item in items:
        rendered = render(card, seeing_model.conversation(item), processor)
        answer = f"{item.answer}{END}"
        texts.append(rendered.prompt + answer)
        images += rendered.images
        answer_lengths.append(len(processor.tokenizer(answer, add_special_tokens=False)["input_ids"]))
    batch = processor(text=texts, images=images or None, padding=True, return_tensors="pt")
    labels = torch.full_like(batch["input_ids"], -100)
    for row, length in enumerate(answer_lengths):
        end = int(batch["attention_mask"][row].sum())
        labels[row, end - length : end] = batch["input_ids"][row, end - length : end]
    batch["labels"] = labels
    return dict(batch)


async def accuracy(
    manager: EngineManager, key: str, per_kind: int, seed: int, kinds: tuple[str, ...] = SECOND_KINDS
) -> dict[str, float]:
    """The share of right answers of each of `kinds`, on `per_kind` new questions each (a seed
    other than training's), asked through the engine manager."""
    rng = random.Random(seed)  # noqa: S311 (test data, seeded to be reproducible)
    items = [example(rng, kind) for kind in kinds for _ in range(per_kind)]
    answers = await asyncio.gather(
        *(ask(manager, key, seeing_model.conversation(item, rng)) for item in items)
    )
    right = dict.fromkeys(kinds, 0)
    for item, answer in zip(items, answers, strict=True):
        right[item.kind] += right_answer(item.kind, item.answer, answer)
    return {kind: right[kind] / per_kind for kind in kinds}
