"""Tiny "twins" of real catalog cards, so each card can run through the real vLLM engine on CPU.

A twin is a local folder holding what vLLM reads for the card's model except the weights: a
config of the same architecture (`architectures` and `model_type` equal the real model's) at
tiny sizes, a tokenizer with the model's special tokens (a byte-level BPE trained here on a few
lines), the chat template where the card renders through one, and the processor class the
model uses, sized for vLLM's CPU backend (text head size 32, two layers). vLLM makes random
weights itself with `load_format="dummy"`, so nothing is downloaded and no checkpoint layout
matters. The card itself is not changed: `Settings.model_folders` points it at the twin.

Only sizes and the context length differ from the real model. Random weights answer nonsense;
what a twin proves is that vLLM's own processor accepts the card's prompt with the app's media.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from app.catalog.cards import ModelCard
from app.config import Settings
from app.demo.twins import internvl, mrope, native, native_more, remote_code, vllm_processors
from app.demo.twins.common import Builder, mrope_section, train_tokenizer

__all__ = [
    "TWIN_BUILDERS",
    "build_twin",
    "mrope_section",
    "train_tokenizer",
    "twin_cases",
    "twin_settings",
    "twin_status",
    "why_no_twin",
]

# Bump when any builder changes: cached twins of another version are rebuilt.
TWIN_VERSION = 2
MARKER = "twin.json"

# One module per group of architectures; each holds BUILDERS (card key -> builder writing the
# twin's files into a folder) and WHY_NOT (card key -> why that card cannot have a twin here).
GROUPS = [native, internvl, mrope, native_more, remote_code, vllm_processors]

TWIN_BUILDERS: dict[str, Builder] = {key: build for group in GROUPS for key, build in group.BUILDERS.items()}
why_no_twin: dict[str, str] = {key: reason for group in GROUPS for key, reason in group.WHY_NOT.items()}


def twin_cases(card: ModelCard) -> list[str]:
    """What tests/test_twins.py runs on the card's twin through the real engine: the cases the
    card takes, in the catalog's words (its column in docs/CATALOG.md comes from here too)."""
    cases = ["image"] if "image" in card.modalities else []
    if card.media_limits.get("image", 0) > 1:
        cases.append("several images")
    if "video" in card.modalities:
        cases.append("video")
    cases.append("multi-turn")
    if card.media_limits.get("image", 0) >= 3:
        cases.append("three pictures over two turns")
    if {"image", "video"} <= set(card.modalities):
        cases.append("a picture, then a video")
    if card.takes_system_prompt:
        cases.append("system prompt")
    return cases


def twin_status(card: ModelCard) -> str:
    """The catalog table's cell (docs/CATALOG.md): what the card's twin verified on the real
    engine, or why it has none."""
    if card.key in TWIN_BUILDERS:
        return "verified: " + ", ".join(twin_cases(card))
    return "no twin: " + why_no_twin.get(card.key, "no twin builder is written for it yet")


def build_twin(card: ModelCard, root: Path) -> Path:
    """The twin of `card` under `root` (built once: a marker with the version caches it)."""
    try:
        builder = TWIN_BUILDERS[card.key]
    except KeyError:
        reason = why_no_twin.get(card.key, "no twin builder is written for it yet")
        raise KeyError(f"{card.key}: no twin: {reason}") from None
    folder = Path(root) / card.key
    marker = folder / MARKER
    stamp = {"version": TWIN_VERSION, "card": card.key, "architecture": card.architecture}
    if marker.is_file() and json.loads(marker.read_text()) == stamp:
        return folder
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    builder(card, folder)
    marker.write_text(json.dumps(stamp))
    return folder


def twin_settings(folders: dict[str, Path], **overrides: Any) -> Settings:
    """CPU settings that point each card at its twin's folder (one engine at a time), with
    vLLM's random weights (`load_format="dummy"`: twins hold no weights)."""
    values: dict[str, Any] = {
        "gpu_count": 0,
        "cpu_kv_cache_bytes": 64 * 2**20,
        "idle_unload_s": 0,
        "drain_timeout_s": 60,
        "max_resident": 1,
        "model_folders": dict(folders),
        "load_format": "dummy",
        # One CPU process per engine: tensor parallelism is a deployment size, not a format.
        "tensor_parallel_size": 1,
    }
    values.update(overrides)
    return Settings(**values)
