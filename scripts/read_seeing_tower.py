"""What the first seeing model's vision tower carries, whatever its text model makes of it: linear
probes fitted on the tower's frozen features (pictures of the training generator, another seed),
then read on held-out pictures and on the foreign set's box, count and kind-of-shape questions:

    .venv/bin/python scripts/read_seeing_tower.py [--model DIR] [--steps N] [--untrained]

For each shape, the box read from the mean of its own tokens' probes (on the foreign pictures,
whose owners are not known, the tokens over the inner half of its true box), counted when every
side is within a tenth of the picture, as the held-out box question counts; for each token a
shape covers, its colour and kind of shape; for each picture, how many shapes it holds (the
mean of its tokens' count probe, as the vision lesson teaches every token the count); on the
foreign set's lone shapes, their kind (the tokens the probe finds a shape on, summed). The text
model cannot say more than the tower carries: a kind whose figure here is far below the target
is the tower's to learn first (docs/BENCHMARKS.md). About two minutes on two cores (the default
600 steps). `--untrained`: the same tower with the random weights it starts from, the figures a
trained tower's are gains over.
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from app.demo.models import SEEING_FOLDER  # noqa: E402
from app.demo.seeing_check import foreign_set  # noqa: E402
from app.demo.seeing_model import (  # noqa: E402
    BATCH,
    BOX_NUMBERS,
    PROBES,
    TOKEN_SHAPES,
    lesson_scene,
    token_labels,
)
from app.demo.shapes import COUNTS  # noqa: E402

FOREIGN = ROOT / "tests" / "data" / "foreign-shapes"
PROBE_SEED, HELD_OUT_SEED, HELD_OUT = 99, 12345, 160


class Tower:
    """The trained model's tower, frozen, with its processor: features and token grid per picture."""

    def __init__(self, folder: Path, untrained: bool = False) -> None:
        import torch
        from transformers import AutoConfig, AutoProcessor, Qwen3VLForConditionalGeneration

        if untrained:
            torch.manual_seed(PROBE_SEED)
            model = Qwen3VLForConditionalGeneration(AutoConfig.from_pretrained(folder))
        else:
            model = Qwen3VLForConditionalGeneration.from_pretrained(folder, dtype=torch.float32)
        self.visual = model.model.visual.eval()
        self.width = model.config.text_config.hidden_size
        self.processor = AutoProcessor.from_pretrained(folder)

    def features(self, images: list[Any]) -> tuple[Any, list[tuple[int, int]]]:
        import torch

        inputs = self.processor.image_processor(images=images, return_tensors="pt")
        with torch.no_grad():
            found = self.visual(inputs["pixel_values"], grid_thw=inputs["image_grid_thw"]).pooler_output
        merge = self.visual.spatial_merge_size
        return found, [
            (rows // merge, columns // merge) for _, rows, columns in inputs["image_grid_thw"].tolist()
        ]


def fit_probes(tower: Tower, steps: int, pool: int | None = None) -> dict[str, Any]:
    """Linear probes of box, colour, kind of shape and count, fitted on the frozen tower's features: a
    new batch of pictures each step, or with `pool`, that many batches drawn once and gone over
    in turn (the tower's forward pass is nearly all the time; the probes' steps cost little)."""
    import torch

    torch.manual_seed(PROBE_SEED)
    # The vision lesson's own probes' sizes (`PROBES`), of the labels read here.
    probes = torch.nn.ModuleDict(
        {name: torch.nn.Linear(tower.width, PROBES[name]) for name in ("box", "colour", "shape", "count")}
    )
    optimizer = torch.optim.Adam(probes.parameters(), lr=3e-3)
    rng = random.Random(PROBE_SEED)  # noqa: S311 (probe data, seeded to be reproducible)
    drawn = [batch_features(tower, rng) for _ in range(pool or 0)]
    for step in range(steps):
        features, labels = drawn[step % len(drawn)] if drawn else batch_features(tower, rng)
        boxes = torch.tensor(labels["box"])
        owned = boxes[:, 0] >= 0
        loss = torch.nn.functional.mse_loss(probes["box"](features)[owned], boxes[owned])
        for name in ("colour", "shape", "count"):
            loss = loss + torch.nn.functional.cross_entropy(
                probes[name](features), torch.tensor(labels[name])
            )
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return dict(probes.items())


def batch_features(tower: Tower, rng: random.Random) -> tuple[Any, dict[str, list[Any]]]:
    """A batch of the vision lesson's pictures: the tower's features and each token's labels."""
    scenes = [lesson_scene(rng) for _ in range(BATCH)]
    features, grids = tower.features([found.image for found in scenes])
    labels: dict[str, list[Any]] = {"box": [], "colour": [], "shape": [], "count": []}
    for found, (rows, columns) in zip(scenes, grids, strict=True):
        for name, values in token_labels(found, rows, columns).items():
            if name in labels:
                labels[name] += values
    return features, labels


def within_a_tenth(said: np.ndarray, truth: np.ndarray) -> bool:
    return bool((np.abs(said - truth) <= 0.1).all())


def read_held_out(
    tower: Tower, probes: dict[str, Any], pictures: int = HELD_OUT
) -> dict[str, tuple[int, int]]:
    """(right, asked): shapes whose box the mean of their tokens' probes gives within a tenth;
    tokens a shape covers whose colour and kind of shape the probes give; pictures whose count
    the mean of their tokens' count probe gives."""
    import torch

    rng = random.Random(HELD_OUT_SEED)  # noqa: S311 (test data, seeded to be reproducible)
    scenes = [lesson_scene(rng) for _ in range(pictures)]
    score = {"box": [0, 0], "colour": [0, 0], "shape": [0, 0], "count": [0, 0]}
    for start in range(0, pictures, BATCH):
        batch = scenes[start : start + BATCH]
        features, grids = tower.features([found.image for found in batch])
        with torch.no_grad():
            said = {name: probe(features).numpy() for name, probe in probes.items()}
        first = 0
        for found, (rows, columns) in zip(batch, grids, strict=True):
            labels = token_labels(found, rows, columns)
            tokens = slice(first, first + rows * columns)
            first += rows * columns
            # Of the tokens a shape covers only: most tokens are the background's, which even an
            # untrained tower's features tell apart.
            covered = np.array(labels["colour"]) > 0
            for name in ("colour", "shape"):
                read = said[name][tokens].argmax(1) == np.array(labels[name])
                score[name][0] += int(read[covered].sum())
                score[name][1] += int(covered.sum())
            score["count"][0] += int(said["count"][tokens].mean(0).argmax()) == len(found.shapes) - 1
            score["count"][1] += 1
            width, height = found.image.size
            for left, top, right, bottom in found.boxes:
                truth = np.array([left / width, top / height, right / width, bottom / height])
                own = [i for i, box in enumerate(labels["box"]) if np.allclose(box, truth, atol=1e-6)]
                score["box"][0] += bool(own) and within_a_tenth(said["box"][tokens][own].mean(0), truth)
                score["box"][1] += 1
    return {name: (right, asked) for name, (right, asked) in score.items()}


def read_foreign(tower: Tower, probes: dict[str, Any]) -> dict[str, tuple[int, int]]:
    """(right, asked) of the foreign set's box questions, each shape's box read from the tokens
    over the inner half of its true box; of its count questions, from the mean of every token's
    count probe; of its kind-of-shape questions (one shape a picture), from the shape probe summed
    over the tokens it finds a shape on."""
    import torch
    from PIL import Image

    def read(question: Any) -> tuple[dict[str, np.ndarray], int, int]:
        features, [(height, width)] = tower.features([Image.open(question.files[0]).convert("RGB")])
        with torch.no_grad():
            return {name: probe(features).numpy() for name, probe in probes.items()}, height, width

    score = {"box": [0, 0], "count": [0, 0], "shape": [0, 0]}
    for question in foreign_set(FOREIGN):
        if question.kind not in score:
            continue
        said, height, width = read(question)
        if question.kind == "count":
            # The count label is the number of shapes less one (`token_labels`).
            right = COUNTS[int(said["count"].mean(0).argmax()) + 1] == question.answer
        elif question.kind == "shape":
            found = said["shape"].argmax(1) > 0
            logits = said["shape"][found] if found.any() else said["shape"]
            right = TOKEN_SHAPES[int(logits[:, 1:].sum(0).argmax()) + 1] == question.answer
        else:
            match = BOX_NUMBERS.search(question.answer)
            if match is None:
                raise ValueError(f"no box in the answer to {question.files[0].name}")
            truth = np.array([int(n) / 1000 for n in match.groups()])
            centre, half = (truth[:2] + truth[2:]) / 2, (truth[2:] - truth[:2]) / 4
            inner = [
                token
                for token in range(height * width)
                if abs((token % width + 0.5) / width - centre[0]) <= half[0] + 0.5 / width
                and abs((token // width + 0.5) / height - centre[1]) <= half[1] + 0.5 / height
            ]
            right = within_a_tenth(said["box"][inner].mean(0), truth)
        score[question.kind][0] += bool(right)
        score[question.kind][1] += 1
    return {name: (right, asked) for name, (right, asked) in score.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=SEEING_FOLDER, help="a trained first seeing model")
    parser.add_argument("--steps", type=int, default=600, help="steps fitting the probes")
    parser.add_argument("--untrained", action="store_true", help="the tower's random starting weights")
    options = parser.parse_args()
    if not (options.model / "config.json").is_file():
        # A folder is read, never a name: transformers would take a name for the Hub's.
        parser.error(f"{options.model} is not a trained model's folder (it has no config.json)")
    tower = Tower(options.model, options.untrained)
    probes = fit_probes(tower, options.steps)
    units = {"box": "shapes", "count": "pictures"}
    for name, (right, asked) in read_held_out(tower, probes).items():
        unit = units.get(name, "tokens a shape covers")
        print(f"held out, {name:6}: {right}/{asked} {unit} = {right / asked:.0%}")
    for name, (right, asked) in read_foreign(tower, probes).items():
        print(f"foreign set, {name:5}: {right}/{asked} questions = {right / asked:.0%}")


if __name__ == "__main__":
    main()
