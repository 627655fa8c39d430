"""What every part of the GPU check shares: the engine limits and memory thresholds, the two
models' published sizes (`ModelSpec`, `SPECS`) and what each needs of a GPU, the hooks a smoke
test on the CPU backend sets, and the progress log and error text.

In one module so that the folders, the engines, the phases and the report read the same numbers.
"""

from __future__ import annotations

import math
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from app.catalog.cards import QWEN_PATCH_PIXELS
from app.engines.memory import GPU_ENGINE_OVERHEAD_BYTES

GIB = 2**30
MAX_MODEL_LEN = 4096
MAX_NUM_SEQS = 4
MAX_POSITION_EMBEDDINGS = 32768
# Qwen2-VL's processor defaults to 3136..12845056 pixels (up to 16384 tokens an image, more than
# MAX_MODEL_LEN); vLLM's Qwen2-VL example caps it at 1280 tokens, as done here.
MIN_PIXELS, MAX_PIXELS = 4 * QWEN_PATCH_PIXELS, 1280 * QWEN_PATCH_PIXELS
IMAGE_SIDE = 448  # 256 visual tokens
# Besides weights and KV cache, what each engine is expected to take (the CUDA context, the
# profiling run's activations with the vision encoder, CUDA graphs): the app's own figure, so that
# the check's shares and the app's bookings agree. The check measures the real figure (each build's
# NVML footprint against its weights and KV cache) and reports both.
ENGINE_MARGIN_BYTES = GPU_ENGINE_OVERHEAD_BYTES
# The share of the GPU the check's engines may take together (the app's default budget).
BUDGET_FRACTION = 0.9
# Room left above a measured footprint when it sizes an engine's share.
MEASURED_SLACK_BYTES = 512 * 2**20
# Memory still in use after everything is shut down that counts as "back" (as in the app).
MEMORY_SLACK_BYTES = 512 * 2**20
MEMORY_RETURN_TIMEOUT_S = 60.0
PROMPT = (
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
    "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>Describe this picture.<|im_end|>\n"
    "<|im_start|>assistant\n"
)

# Hooks for trying the flow without a GPU (a smoke test on the CPU backend sets these, here on
# `gpu_check.common`: the engines, the cards and the manager phase read them through this module
# when they run): engine arguments applied over the check's own, and the GPU count the manager's
# settings are given.
ENGINE_OVERRIDES: dict[str, Any] = {}
# The engines' dtype: bfloat16, or float16 on GPUs older than compute capability 8.0 (a T4 or a
# V100, where vLLM refuses bfloat16); the command line sets it from the GPU.
DTYPE = "bfloat16"
# The image processor's pixel range for every engine, written in the folders and passed to vLLM
# (a cached real model's own processor would let an image reach 16,384 tokens).
PIXELS = {"min_pixels": MIN_PIXELS, "max_pixels": MAX_PIXELS}
MANAGER_GPU_COUNT = 1


@dataclass(frozen=True)
class ModelSpec:
    """The published sizes of one Qwen2-VL model (its config.json on the hub)."""

    role: str
    key: str
    title: str
    # The published model these sizes are of (its weights are used where they are in the cache).
    repo: str
    hidden_size: int
    intermediate_size: int
    layers: int
    heads: int
    kv_heads: int
    vocab_size: int
    tie_word_embeddings: bool
    # Parameters as published (the hub's model page), for the dry run's check and memory sizing.
    parameters: int
    vision_depth: int = 32
    vision_embed_dim: int = 1280
    vision_heads: int = 16
    vision_mlp_ratio: int = 4

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.heads

    @property
    def weights_bytes(self) -> int:
        return self.parameters * 2  # bfloat16

    @property
    def kv_bytes_per_token(self) -> int:
        return 2 * self.layers * self.kv_heads * self.head_dim * 2

    @property
    def kv_reserve_bytes(self) -> int:
        """The KV cache the engine is given (`kv_cache_memory_bytes`, as the app gives it): room
        for MAX_NUM_SEQS sequences of MAX_MODEL_LEN tokens."""
        return self.kv_bytes_per_token * MAX_MODEL_LEN * MAX_NUM_SEQS

    @property
    def need_bytes(self) -> int:
        """What the engine is expected to take on the GPU: weights, KV cache, the margin."""
        return self.weights_bytes + self.kv_reserve_bytes + ENGINE_MARGIN_BYTES

    def second(self) -> ModelSpec:
        """The same model as the second engine of a pair (a GPU too small for the 7B-class)."""
        return replace(self, role="large", key=f"{self.key}-second", title=f"{self.title} (second engine)")


SPECS = {
    "small": ModelSpec(
        "small",
        "qwen2-vl-2b-dummy",
        "Qwen2-VL-2B-class",
        "Qwen/Qwen2-VL-2B-Instruct",
        hidden_size=1536,
        intermediate_size=8960,
        layers=28,
        heads=12,
        kv_heads=2,
        vocab_size=151936,
        tie_word_embeddings=True,
        parameters=2_208_985_600,
    ),
    "large": ModelSpec(
        "large",
        "qwen2-vl-7b-dummy",
        "Qwen2-VL-7B-class",
        "Qwen/Qwen2-VL-7B-Instruct",
        hidden_size=3584,
        intermediate_size=18944,
        layers=28,
        heads=28,
        kv_heads=4,
        vocab_size=152064,
        tie_word_embeddings=False,
        parameters=8_291_375_616,
    ),
}


def choose_pair(total: int | None) -> dict[str, ModelSpec]:
    """The two models the check runs, sized from the GPU's memory: the 2B-class and the
    7B-class model where both fit in the budget at once (about 32 GB and up), else two engines of
    the 2B-class model, so that two engines and sleep against rebuild are measured on smaller
    cards too (24 GB: 2 x 8.1 GB; on 16 GB only if the measured footprints allow, see
    `Plan.fits_together`). Without a GPU (the dry run): both models."""
    small, large = SPECS["small"], SPECS["large"]
    if total is None or small.need_bytes + large.need_bytes <= BUDGET_FRACTION * total:
        return {"small": small, "large": large}
    return {"small": small, "large": small.second()}


def share(need_bytes: int, total: int | None) -> float:
    """`gpu_memory_utilization` covering `need_bytes`, rounded up to a hundredth. With the KV
    cache given in bytes, vLLM uses it only to check, at the build, that this much is free."""
    if total is None:
        return 0.4
    return min(0.95, math.ceil(100 * need_bytes / total) / 100)


def describe_model(spec: ModelSpec, folder: Path, util: float | None = None) -> dict[str, Any]:
    described = {
        "title": spec.title,
        "folder": str(folder),
        "parameters": spec.parameters,
        "weights_gib": round(spec.weights_bytes / GIB, 2),
        "kv_cache_reserve_gib": round(spec.kv_reserve_bytes / GIB, 3),
        "expected_gib": round(spec.need_bytes / GIB, 2),
    }
    if util is not None:
        described["gpu_memory_utilization"] = util
    return described


def fitted_utilization(spec: ModelSpec, total: int | None) -> float:
    """`gpu_memory_utilization` covering the weights, the KV cache reserve of MAX_NUM_SEQS full
    sequences and the margin, rounded up to a hundredth (the fraction vLLM may take of the GPU)."""
    return share(spec.need_bytes, total)


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def gib(value: int | None) -> float | None:
    return None if value is None else round(value / GIB, 3)


def describe_error(error: BaseException) -> str:
    if isinstance(error, TimeoutError):
        return "timed out"
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0][:400]}" if text else type(error).__name__
