"""How much memory a model's engine takes, from what is at hand: the card, the model's files.

The scheduler places engines by memory, not by count, so it needs each model's footprint before
the model is built. The figure is an estimate made of three parts:

- weights: the safetensors files (or their index's `total_size`) where the model is on disk,
  else the parameters its local `config.json` describes (folders for vLLM's dummy weights),
  else the card's `parameters_b` or the parameter count in the repository's name (`7B`, `2.2B`,
  `800m`), at the bytes per parameter of its dtype (FP8 one, AWQ/GPTQ/int4 a half, else two);
- the KV cache reserve: `max_model_len x max_num_seqs` tokens at the bytes per token of the
  text model's layers, KV heads and head size where its `config.json` is at hand, else a ratio
  to the weights typical of grouped-query attention models;
- a fixed engine overhead per GPU (CUDA context, activations, CUDA graphs), which is also what a
  sleeping engine keeps on the GPU.

No torch, no vLLM: the UI process and the simulation use it too.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app.catalog.cards import ModelCard

GIB = 2**30
# What an engine holds per GPU besides weights and KV cache (CUDA context, activations, CUDA
# graphs); also what a sleeping engine (level 1) keeps on each GPU.
GPU_ENGINE_OVERHEAD_BYTES = 2 * GIB
# An engine process on the CPU backend: Python, torch and vLLM's modules (measured 800-950 MB).
CPU_ENGINE_OVERHEAD_BYTES = 1 * GIB
# Where neither files, card nor name tell: a mid-size model, so an unknown one is not squeezed in.
UNKNOWN_WEIGHTS_BYTES = 16 * GIB
UNKNOWN_CPU_WEIGHTS_BYTES = GIB // 4
# KV bytes per token per byte of weights when the config is not at hand: about what 7B-class
# grouped-query attention models have (Qwen2-7B: 57 KB a token for 15 GB of weights).
KV_BYTES_PER_TOKEN_PER_WEIGHT_BYTE = 1 / 100_000
DEFAULT_MAX_MODEL_LEN = 4096
# vLLM's own default is 256 sequences, far more than a playground serves at once: the reserve
# assumes this many full-length sequences where the card does not set `max_num_seqs`.
DEFAULT_MAX_NUM_SEQS = 4


@dataclass(frozen=True)
class MemoryNeed:
    """One engine's footprint: on each of the GPUs it spans (or in host memory on CPU), and in
    host memory while it sleeps."""

    weights_bytes: int
    kv_bytes: int
    overhead_bytes: int
    devices: int = 1

    @property
    def per_device(self) -> int:
        """Bytes on each device while awake (tensor parallelism splits weights and KV cache)."""
        return math.ceil((self.weights_bytes + self.kv_bytes) / self.devices) + self.overhead_bytes

    @property
    def asleep_per_device(self) -> int:
        """Bytes a sleeping engine keeps on each device (level 1: weights moved out, KV dropped)."""
        return self.overhead_bytes

    @property
    def asleep_host(self) -> int:
        """Host memory a sleeping engine takes: its weights."""
        return self.weights_bytes

    def describe(self) -> str:
        where = f" on each of {self.devices} GPUs" if self.devices > 1 else ""
        return f"{self.per_device / GIB:.1f} GiB{where}"


def bytes_per_parameter(card: ModelCard) -> float:
    args = card.engine_args
    text = f"{card.hf_repo} {args.get('quantization', '')} {args.get('dtype', '')}".lower()
    if re.search(r"awq|gptq|int4|4bit|bnb", text):
        return 0.5
    if re.search(r"fp8|int8|8bit", text):
        return 1.0
    if "float32" in text or "fp32" in text:
        return 4.0
    return 2.0


def parameters_from_name(repo: str) -> float | None:
    """Billions of parameters as the repository's name states them: `Qwen2-VL-7B` 7, `h2ovl-
    mississippi-800m` 0.8, `Qwen3-VL-30B-A3B` 30 (all experts count), `Llama-4-Scout-17B-16E`
    none (the experts are not in the number)."""
    name = repo.rsplit("/", 1)[-1]
    if re.search(r"\d+E\b", name):
        return None
    sizes = [
        float(number) * (1e-3 if unit.lower() == "m" else 1.0)
        for number, unit in re.findall(r"(?<![A-Za-z\d.])(\d+(?:\.\d+)?)([BbMm])(?![a-zA-Z])", name)
    ]
    return max(sizes) if sizes else None


def weights_on_disk(folder: Path) -> int | None:
    """The weights' size where the model is a local folder: the index's total, else the files."""
    if not folder.is_dir():
        return None
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        try:
            total = json.loads(index.read_text()).get("metadata", {}).get("total_size")
            if isinstance(total, int) and total > 0:
                return total
        except (OSError, ValueError):
            pass
    return sum(f.stat().st_size for f in folder.glob("*.safetensors")) or None


def _read_config(folder: Path | None) -> dict[str, Any] | None:
    path = folder / "config.json" if folder is not None else None
    if path is None or not path.is_file():
        return None
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return config if isinstance(config, dict) else None


def _text_model(config: dict[str, Any]) -> dict[str, Any]:
    """The text model's part of a config: nested under the thinker in Qwen2.5-Omni (the part vLLM
    serves), under text_config or llm_config in most VLMs, else the config itself."""
    config = config.get("thinker_config") or config
    return config.get("text_config") or config.get("llm_config") or config


def parameters_from_config(config: dict[str, Any]) -> float | None:
    """Billions of parameters a `config.json` describes (text model: embeddings, attention and
    a gated MLP per layer; vision tower: about 12 x hidden^2 per layer), where no weights are on
    disk (`load_format="dummy"` folders)."""
    text = _text_model(config)
    try:
        hidden = int(text["hidden_size"])
        layers = int(text["num_hidden_layers"])
        heads = int(text["num_attention_heads"])
        kv_heads = int(text.get("num_key_value_heads") or heads)
        head_dim = int(text.get("head_dim") or hidden // heads)
        intermediate = int(text.get("intermediate_size") or 4 * hidden)
        vocab = int(text.get("vocab_size") or config.get("vocab_size") or 0)
    except (KeyError, TypeError, ValueError, ZeroDivisionError):
        return None
    attention = hidden * head_dim * (2 * heads + 2 * kv_heads)
    total = layers * (attention + 3 * hidden * intermediate)
    total += vocab * hidden * (1 if text.get("tie_word_embeddings", config.get("tie_word_embeddings")) else 2)
    vision = config.get("vision_config") or {}
    width = vision.get("hidden_size") or vision.get("embed_dim")
    depth = vision.get("num_hidden_layers") or vision.get("depth")
    if isinstance(width, int) and isinstance(depth, int):
        total += 12 * width * width * depth
    return total / 1e9


def kv_bytes_per_token(config: dict[str, Any], dtype_bytes: int = 2) -> int | None:
    """Key and value bytes per token for every layer of the text model a `config.json` describes."""
    text = _text_model(config)
    try:
        layers = int(text["num_hidden_layers"])
        heads = int(text["num_attention_heads"])
        kv_heads = int(text.get("num_key_value_heads") or heads)
        head_dim = int(text.get("head_dim") or int(text["hidden_size"]) // heads)
    except (KeyError, TypeError, ValueError, ZeroDivisionError):
        return None
    return 2 * layers * kv_heads * head_dim * dtype_bytes


def estimate_need(
    card: ModelCard, folder: Path | None, on_gpu: bool, cpu_kv_cache_bytes: int = 0
) -> MemoryNeed:
    """The footprint of `card`'s engine; `folder` is the model's local copy where there is one."""
    args = card.engine_args
    folder = folder or (Path(args["model"]) if Path(str(args.get("model", ""))).is_absolute() else None)
    weights = weights_on_disk(folder) if folder is not None else None
    config = _read_config(folder)
    if weights is None:
        # A local folder without weights (vLLM's dummy weights) is the model its config says;
        # elsewhere the card's figure or the repository's name tells.
        params = parameters_from_config(config) if config is not None else None
        params = params or card.parameters_b or parameters_from_name(card.hf_repo)
        if params:
            weights = int(params * 1e9 * bytes_per_parameter(card))
        else:
            # The CPU backend only serves small models (the demo's, the twins').
            weights = UNKNOWN_WEIGHTS_BYTES if on_gpu else UNKNOWN_CPU_WEIGHTS_BYTES
    if not on_gpu:
        # The CPU backend's KV cache is the fixed size the app gives it.
        return MemoryNeed(weights, cpu_kv_cache_bytes, CPU_ENGINE_OVERHEAD_BYTES, devices=1)
    per_token = kv_bytes_per_token(config) if config is not None else None
    if per_token is None:
        per_token = max(1, int(weights * KV_BYTES_PER_TOKEN_PER_WEIGHT_BYTE))
    tokens = int(args.get("max_model_len") or DEFAULT_MAX_MODEL_LEN) * int(
        args.get("max_num_seqs") or DEFAULT_MAX_NUM_SEQS
    )
    return MemoryNeed(weights, per_token * tokens, GPU_ENGINE_OVERHEAD_BYTES, devices=card.gpus_needed)
