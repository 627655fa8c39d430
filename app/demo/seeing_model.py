"""The seeing demo model: a tiny Qwen2-VL trained on this machine's CPU on pictures and clips of
coloured shapes (`app.demo.shapes`), so that it answers simple visual questions right. It is how the
tests prove that the pixels a user sends are the pixels the model sees (a swapped channel, a
lost rotation, frames out of order all give wrong answers), and what a machine without a GPU
demos with answers that mean something.

It is the Qwen2-VL twin (`app.demo.twins`: the real architecture, processor and chat template at tiny
sizes) with small image sizes, trained with transformers from a fixed seed and saved as
safetensors, which vLLM loads like any checkpoint. Built on first use (a few minutes on two
cores) and cached by a version marker. torch and transformers are imported inside functions.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import random
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from app.catalog.cards import ModelCard
from app.demo import shapes
from app.demo.shapes import CLIP_FRAMES, KINDS, Example, example
from app.engines.base import SamplingSettings, StreamEnd, TextDelta
from app.engines.manager import EngineManager

log = logging.getLogger(__name__)

SEEING_KEY = "demo_seeing"
SEEING_VERSION = 1
SEED = 20261122
BATCH, VISION_LEARNING_RATE, ANSWER_LEARNING_RATE = 16, 2e-3, 1e-3


@dataclass(frozen=True)
class Steps:
    """Training steps of each lesson (about 0.05 s and 0.15 s a step on two cores)."""

    vision: int = 2500
    answers: int = 2400


STEPS = Steps()
VISION = {"depth": 4, "embed_dim": 128, "num_heads": 4}
TEXT_LAYERS = 4
# Every picture and frame is resized to at most 112x112 pixels (16 tokens after the merge).
MIN_PIXELS, MAX_PIXELS = 56 * 56, 112 * 112
MARKER = "seeing.json"


def seeing_card(qwen2_vl: ModelCard, folder: Path) -> ModelCard:
    """The Qwen2-VL card, served from the trained model in `folder`: its prompt format, with
    this model's image sizes and clip length."""
    fields = qwen2_vl.model_dump()
    args = dict(fields["reference_engine_args"])
    args.update(model=str(folder), mm_processor_kwargs={"min_pixels": MIN_PIXELS, "max_pixels": MAX_PIXELS})
    fields.update(
        key=SEEING_KEY,
        display_name="Shapes and colours: tiny demo model trained here",
        family="Demo",
        hf_repo=str(folder),
        made_here="a tiny model trained by this project on drawings of shapes (app.demo.seeing_model)",
        reference=(
            f"trained by app.demo.seeing_model on app.demo.shapes (seed {SEED}); "
            f"prompt format of {qwen2_vl.key}"
        ),
        reference_engine_args=args,
        video_frames=CLIP_FRAMES,
        # Its answers are one word it is sure of: greedy gives the same word every time.
        sampling_defaults={"temperature": 0.0},
        runs_on_cpu=True,
        hardware="Runs anywhere, CPU included: about 3 MB.",
        notes=(
            "A tiny Qwen2-VL trained on this machine on drawings of shapes. It answers, in one word, "
            "the colour of a shape (red, green, blue, yellow, black), its kind (circle, square, "
            "triangle), its side (left or right), how many shapes there are (one to three), the "
            "colour in the first or second of two pictures, and the colour a clip starts or ends "
            "with. Anything else gets one of those words."
        ),
    )
    return ModelCard.model_validate(fields)


def training_stamp(steps: Steps = STEPS) -> dict[str, Any]:
    """What a trained model was made by: the training's version and steps, and the hash of the
    data generator's and the training's source. Any change to them means training again."""
    sources = b"".join(Path(module.__file__ or "").read_bytes() for module in (shapes, sys.modules[__name__]))
    return {"version": SEEING_VERSION, "steps": asdict(steps), "sources": hashlib.sha256(sources).hexdigest()}


def made_by(folder: Path, stamp: dict[str, Any]) -> bool:
    marker = Path(folder) / MARKER
    return marker.is_file() and json.loads(marker.read_text()) == stamp


def build_seeing_model(
    root: Path,
    qwen2_vl: ModelCard,
    steps: Steps = STEPS,
    report: Callable[[str], None] = log.info,
    committed: Path | None = None,
) -> Path:
    """The trained model: `committed` (the weights in the repository) where they carry the stamp
    of this code and `steps`, else trained once under `root` (cached by the same stamp)."""
    stamp = training_stamp(steps)
    if committed is not None and made_by(committed, stamp):
        return Path(committed)
    folder = Path(root) / SEEING_KEY
    marker = folder / MARKER
    if made_by(folder, stamp):
        return folder
    if folder.exists():
        shutil.rmtree(folder)
    train(folder, qwen2_vl, steps, report)
    marker.write_text(json.dumps(stamp))
    return folder


def train(folder: Path, qwen2_vl: ModelCard, steps: Steps, report: Callable[[str], None]) -> None:
    import torch
    from transformers import (
        AutoConfig,
        AutoProcessor,
        Qwen2VLForConditionalGeneration,
        Qwen2VLImageProcessor,
        Qwen2VLVideoProcessor,
    )

    from app.demo.twins import build_twin
    from app.demo.twins.common import QWEN2_VL_CHAT_TEMPLATE, QWEN_SPECIAL_TOKENS, train_tokenizer

    twin = build_twin(qwen2_vl, folder.parent / "twins")
    shutil.copytree(twin, folder)
    (folder / "twin.json").unlink(missing_ok=True)
    size = {"shortest_edge": MIN_PIXELS, "longest_edge": MAX_PIXELS}
    processor = AutoProcessor.from_pretrained(folder)
    # The twin's tokenizer, trained again on this model's questions and answers, so that each
    # answer is one token (the loss is then all about what the model saw). Its special tokens
    # keep their ids, so the config's token ids stay right.
    tokenizer = train_tokenizer(
        QWEN_SPECIAL_TOKENS,
        eos="<|im_end|>",
        pad="<|endoftext|>",
        chat_template=QWEN2_VL_CHAT_TEMPLATE,
        text=vocabulary_text(),
    )
    if tokenizer.convert_tokens_to_ids(QWEN_SPECIAL_TOKENS) != processor.tokenizer.convert_tokens_to_ids(
        QWEN_SPECIAL_TOKENS
    ):
        raise RuntimeError("the retrained tokenizer moved the special tokens")
    processor.tokenizer = tokenizer
    processor.image_processor = Qwen2VLImageProcessor(size=size)
    processor.video_processor = Qwen2VLVideoProcessor(size=size)
    processor.save_pretrained(folder)
    # Padding on the right: positions then start at 0 in every row, as in a single prompt at
    # inference (with left padding, M-RoPE positions shifted and the model learned the shift).
    processor.tokenizer.padding_side = "right"
    card = seeing_card(qwen2_vl, folder)

    # Larger than the twin where seeing needs it: a deeper, wider vision tower and two more
    # text layers (shape, side and count were at chance with the twin's two-layer tower).
    config = AutoConfig.from_pretrained(folder)
    config.vision_config.update(VISION)
    config.text_config.num_hidden_layers = TEXT_LAYERS
    config.text_config.layer_types = ["full_attention"] * TEXT_LAYERS
    config.save_pretrained(folder)
    torch.manual_seed(SEED)
    model = Qwen2VLForConditionalGeneration(config)
    rng = random.Random(SEED)  # noqa: S311 (training data, seeded to be reproducible)
    teach_vision(model, processor, rng, steps.vision, report)
    teach_answers(model, processor, card, rng, steps.answers, report)
    # Saved in bfloat16, the type vLLM serves it in on the CPU: half the size on disk.
    model.to(torch.bfloat16).save_pretrained(folder)


def teach_vision(
    model: Any, processor: Any, rng: random.Random, steps: int, report: Callable[[str], None]
) -> None:
    """Lesson one: the vision tower learns to see colour, shape, side and count, with a linear
    probe per question on its mean output (dropped afterwards), as a real VLM's tower comes
    pretrained. Trained end to end from the answers alone, the tiny model learned colour
    but stayed at chance on shape, side and count: the answer's loss reaches the tower too weakly."""
    import torch

    visual = model.model.visual
    width = model.config.text_config.hidden_size
    probes = torch.nn.ModuleDict({q: torch.nn.Linear(width, len(a)) for q, a in shapes.LABELS.items()})
    parameters = [*visual.parameters(), *probes.parameters()]
    visual.train()

    def loss_of_batch() -> Any:
        pictures = [shapes.labelled_picture(rng) for _ in range(BATCH)]
        inputs = processor.image_processor(images=[p for p, _ in pictures], return_tensors="pt")
        features = visual(inputs["pixel_values"], grid_thw=inputs["image_grid_thw"]).pooler_output
        tokens = (inputs["image_grid_thw"].prod(-1) // visual.spatial_merge_size**2).tolist()
        pooled = torch.stack([f.mean(0) for f in features.split(tokens)])
        loss = 0
        for question, answers in shapes.LABELS.items():
            target = [
                answers.index(labels[question] or "") if labels[question] else -100 for _, labels in pictures
            ]
            loss = loss + torch.nn.functional.cross_entropy(probes[question](pooled), torch.tensor(target))
        return loss

    train_loop("vision", parameters, loss_of_batch, steps, VISION_LEARNING_RATE, report)


def teach_answers(
    model: Any, processor: Any, card: ModelCard, rng: random.Random, steps: int, report: Callable[[str], None]
) -> None:
    """Lesson two: the text model learns to answer the questions from what the tower (now
    frozen) sees, on conversations rendered by the card's prompt format."""
    model.model.visual.requires_grad_(False)
    model.train()
    parameters = [p for p in model.parameters() if p.requires_grad]

    def loss_of_batch() -> Any:
        return model(**model_inputs(processor, card, [example(rng) for _ in range(BATCH)])).loss

    train_loop("answers", parameters, loss_of_batch, steps, ANSWER_LEARNING_RATE, report)
    model.model.visual.requires_grad_(True)


def train_loop(
    lesson: str,
    parameters: list[Any],
    loss_of_batch: Callable[[], Any],
    steps: int,
    learning_rate: float,
    report: Callable[[str], None],
) -> None:
    import torch

    optimizer = torch.optim.AdamW(parameters, lr=learning_rate, weight_decay=0.01)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, learning_rate, total_steps=steps, pct_start=0.1)
    started = time.monotonic()
    for step in range(steps):
        loss = loss_of_batch()
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(parameters, 1.0)
        optimizer.step()
        schedule.step()
        if step % 250 == 0 or step == steps - 1:
            elapsed = time.monotonic() - started
            report(
                f"seeing model, {lesson}: step {step + 1}/{steps}, loss {loss.item():.3f}, {elapsed:.0f} s"
            )


def vocabulary_text() -> list[str]:
    """Lines for the tokenizer: the questions and, many times over, each answer on a line of its
    own (as it follows the prompt: no space before it)."""
    answers = [*shapes.COLOURS, *shapes.SHAPES, *shapes.SIDES, *shapes.COUNTS.values()]
    questions = [question for kind in shapes.QUESTIONS.values() for question in kind]
    return [*questions, "You are a helpful assistant.", *(answers * 200)]


def conversation(item: Example) -> list[dict[str, Any]]:
    """`item` as the app's engine messages (the shape `app.domain.conversation.engine_messages` makes)."""
    messages: list[dict[str, Any]] = []
    if item.earlier is not None:
        images, question, answer = item.earlier
        messages.append(
            {
                "role": "user",
                "content": [
                    *({"type": "image", "image": i} for i in images),
                    {"type": "text", "text": question},
                ],
            }
        )
        messages.append({"role": "assistant", "content": answer})
    parts: list[dict[str, Any]] = [{"type": "image", "image": image} for image in item.images]
    if item.clip is not None:
        parts.append({"type": "video", "video": item.clip})
    messages.append({"role": "user", "content": [*parts, {"type": "text", "text": item.question}]})
    return messages


def model_inputs(processor: Any, card: ModelCard, items: list[Example]) -> dict[str, Any]:
    """A training batch: each conversation rendered by the card's prompt format (as the app
    renders it for the engine) with its answer, loss on the answer only."""
    import torch

    from app.catalog.adapters import render

    texts, images, videos, answer_lengths = [], [], [], []
    for item in items:
        rendered = render(card, conversation(item))
        answer = f"{item.answer}<|im_end|>"
        texts.append(rendered.prompt + answer)
        images += rendered.images
        videos += rendered.videos
        answer_lengths.append(len(processor.tokenizer(answer, add_special_tokens=False)["input_ids"]))
    batch = processor(
        text=texts, images=images or None, videos=videos or None, padding=True, return_tensors="pt"
    )
    labels = torch.full_like(batch["input_ids"], -100)
    for row, length in enumerate(answer_lengths):
        end = int(batch["attention_mask"][row].sum())
        labels[row, end - length : end] = batch["input_ids"][row, end - length : end]
    batch["labels"] = labels
    return dict(batch)


async def ask(manager: EngineManager, key: str, messages: list[dict[str, Any]]) -> str:
    """The model's greedy answer to `messages` through the app's engine manager, stripped."""
    answer = ""
    async for event in manager.stream(key, messages, SamplingSettings(temperature=0.0, max_tokens=8)):
        if isinstance(event, TextDelta):
            answer += event.text
        elif isinstance(event, StreamEnd):
            break
    return answer.strip().rstrip(".").lower()


async def accuracy(manager: EngineManager, key: str, per_kind: int, seed: int) -> dict[str, float]:
    """The share of right answers per question kind, on `per_kind` new questions each (a seed
    other than training's: pictures the model never saw)."""
    rng = random.Random(seed)  # noqa: S311 (test data, seeded to be reproducible)
    items = [example(rng, kind) for kind in KINDS for _ in range(per_kind)]
    answers = await asyncio.gather(*(ask(manager, key, conversation(item)) for item in items))
    right = {kind: 0 for kind in KINDS}
    for item, answer in zip(items, answers, strict=True):
        right[item.kind] += answer == item.answer
    return {kind: right[kind] / per_kind for kind in KINDS}
