"""How much memory a model's engine takes, from the model's own numbers where they can be read.

The scheduler places engines by memory, not by count, so it needs each model's footprint before
the model is built. The figure has three parts:

- weights: the safetensors files (or their index's `total_size`) where the model is on disk (a
  model folder, or the Hugging Face cache), else the tensors the Hub's safetensors headers list
  (read once at start on a GPU box, `facts_from_hub`), else the parameters a local `config.json`
  describes (folders for vLLM's dummy weights), else the card's `parameters_b` or the parameter
  count in the repository's name (`7B`, `2.2B`, `800m`) at the bytes per parameter of its dtype;
- the KV cache reserve: `max_num_seqs` sequences of `max_model_len` tokens, each layer of the
  text model counted as vLLM allocates it (key and value heads times head size, one latent
  vector for multi-head latent attention, the window plus two steps' tokens for sliding-window
  layers, whole blocks), at the KV cache's dtype. Without a config the reserve is one full-length sequence at
  a size per token that covers models without grouped-query attention, and vLLM sizes the cache
  itself within the engine's share;
- an engine overhead per GPU (CUDA context, activations, CUDA graphs): a stated conservative
  default, since vLLM publishes no per-model figure, replaced by what the build really took
  (`MemoryNeed.measured`) once the engine is up.

No torch, no vLLM: the UI process and the simulation use it too.
"""

from __future__ import annotations

import json
import logging
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from app.catalog.cards import ModelCard

log = logging.getLogger(__name__)

GIB = 2**30
# What an engine holds per GPU besides weights and KV cache (CUDA context, activations of the
# profiling run, vision encoder included, CUDA graphs); also what a sleeping engine (level 1)
# keeps on each GPU. A conservative default: vLLM publishes no per-model figure, and the first
# build's measurement replaces it (see `MemoryNeed.measured`).
GPU_ENGINE_OVERHEAD_BYTES = 3 * GIB
# An engine process on the CPU backend: Python, torch and vLLM's modules (measured 800-950 MB).
CPU_ENGINE_OVERHEAD_BYTES = 1 * GIB
# Where neither files, card nor name tell: a mid-size model, so an unknown one is not squeezed in.
UNKNOWN_WEIGHTS_BYTES = 16 * GIB
UNKNOWN_CPU_WEIGHTS_BYTES = GIB // 4
# KV bytes per token per byte of weights where no config is at hand: what the catalog's models
# without grouped-query attention have at most (BLIP-2's OPT-2.7B: 32 layers x 2,560 x 2 x 2 bytes
# = 328 KB a token for 5.4 GB of weights; Phi-3.5-vision: 393 KB for 8.3 GB), up to 1 MiB a token
# (LLaVA-1.5 13B: 800 KB); larger models all group their KV heads. Grouped-query models need 5-10
# times less, which their config then says.
KV_BYTES_PER_TOKEN_PER_WEIGHT_BYTE = 1 / 15_000
MAX_GUESSED_KV_BYTES_PER_TOKEN = 2**20
DEFAULT_MAX_MODEL_LEN = 4096
# vLLM's own default is 256 sequences, far more than a playground serves at once: the reserve
# assumes this many full-length sequences where the card does not set `max_num_seqs`.
DEFAULT_MAX_NUM_SEQS = 4
# vLLM gives a sliding-window layer room for its window plus the tokens of the steps in flight; a
# step is at most `max_num_batched_tokens`: where the card does not set it, 8,192 (vLLM's engine
# default for the app's use is 2,048; its largest default, for offline use on a large GPU, 16,384).
DEFAULT_MAX_NUM_BATCHED_TOKENS = 8192
# Tokens a block of vLLM's KV cache holds on a GPU (its default block size).
KV_BLOCK_TOKENS = 16
# Bytes per element of the dtypes safetensors headers name.
SAFETENSORS_DTYPE_BYTES = {
    "F64": 8,
    "I64": 8,
    "U64": 8,
    "F32": 4,
    "I32": 4,
    "U32": 4,
    "F16": 2,
    "BF16": 2,
    "I16": 2,
    "U16": 2,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
    "F8_E8M0": 1,
    "I8": 1,
    "U8": 1,
    "BOOL": 1,
}


@dataclass(frozen=True)
class ModelFacts:
    """What a model's own files say: its `config.json` and its weights' size, and where read."""

    config: dict[str, Any] | None
    weights_bytes: int | None
    source: str


@dataclass(frozen=True)
class MemoryNeed:
    """One engine's footprint: on each of the GPUs it spans (or in host memory on CPU), and in
    host memory while it sleeps."""

    weights_bytes: int
    kv_bytes: int
    overhead_bytes: int
    devices: int = 1
    # Where the weights' and the KV figures come from, in words (logs, docs/MEMORY.md).
    weights_from: str = "given"
    kv_from: str = "given"
    # Whether weights and KV per token come from the model's own files: a guess is asked again,
    # in case the files have come (downloaded, or read from the Hub) since.
    from_files: bool = True
    # What the engine took on each device, measured once it was built: booked instead.
    measured_per_device: int | None = None
    # The `max_model_len` the KV reserve is for, where it differs from the card's (a chat-sized
    # context on a GPU); the engine is built with it.
    context_tokens: int | None = None
    # How many GPUs the KV cache is split over (fewer than `devices` where the model has fewer
    # KV heads, or latent attention, which every GPU keeps whole); 0: all of them.
    kv_devices: int = 0

    @property
    def per_device(self) -> int:
        """Bytes on each device while awake (tensor parallelism splits weights and KV cache)."""
        if self.measured_per_device is not None:
            return self.measured_per_device
        return self.estimated_per_device

    @property
    def estimated_per_device(self) -> int:
        return math.ceil(self.weights_bytes / self.devices) + self.kv_per_device + self.overhead_bytes

    @property
    def kv_per_device(self) -> int:
        """The KV cache on each GPU: split by heads, each GPU at least one head's share."""
        return math.ceil(self.kv_bytes / (self.kv_devices or self.devices))

    @property
    def kv_from_config(self) -> bool:
        """Whether the KV reserve is the config's arithmetic (then vLLM is given it exactly)."""
        return self.kv_from == "config.json"

    @property
    def asleep_per_device(self) -> int:
        """Bytes a sleeping engine keeps on each device (level 1: weights moved out, KV dropped)."""
        return min(self.overhead_bytes, self.per_device)

    @property
    def asleep_host(self) -> int:
        """Host memory a sleeping engine takes: its weights."""
        return self.weights_bytes

    def measured(self, per_device: int) -> MemoryNeed:
        """This need with what the engine really took on each device booked instead."""
        return replace(self, measured_per_device=per_device, from_files=True)

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
    """The weights' size where the model is on disk: its index's `total_size` (the whole model's,
    whichever shards are there yet), else a single `model.safetensors`. Shards without an index
    are a download under way (vLLM fetches the index last): no figure rather than part of one."""
    try:
        if not folder.is_dir():
            return None
        index = folder / "model.safetensors.index.json"
        if index.is_file():
            total = json.loads(index.read_text()).get("metadata", {}).get("total_size")
            return total if isinstance(total, int) and total > 0 else None
        shards = list(folder.glob("*.safetensors"))
        return shards[0].stat().st_size or None if len(shards) == 1 else None
    except (OSError, ValueError, AttributeError):  # a broken link, an unreadable index
        return None


def _read_config(folder: Path | None) -> dict[str, Any] | None:
    path = folder / "config.json" if folder is not None else None
    try:
        if path is None or not path.is_file():
            return None
        config = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return config if isinstance(config, dict) else None


def facts_in_folder(folder: Path, source: str = "the model's folder") -> ModelFacts | None:
    """The facts of a model on disk (a local folder or a snapshot in the Hugging Face cache)."""
    try:
        if not folder.is_dir():
            return None
    except OSError:
        return None
    config = _read_config(folder)
    weights = weights_on_disk(folder)
    if config is None and weights is None:
        return None
    return ModelFacts(config, weights, source)


def merged(first: ModelFacts | None, second: ModelFacts | None) -> ModelFacts | None:
    """Two readings of one model combined field by field (the cache's config with the Hub's
    weights, say): each figure from the first that has it."""
    if first is None or second is None:
        return first or second
    weights, source = first.weights_bytes, first.source
    if weights is None and second.weights_bytes is not None:
        weights, source = second.weights_bytes, second.source
    return ModelFacts(first.config if first.config is not None else second.config, weights, source)


def facts_in_hub_cache(repo: str, revision: str | None, cache_dir: Path | None = None) -> ModelFacts | None:
    """The facts of a Hub model from the Hugging Face cache alone (no network): its config, and
    its weights where they (or their index) were downloaded."""
    from huggingface_hub import try_to_load_from_cache

    try:
        found = try_to_load_from_cache(repo, "config.json", cache_dir=cache_dir, revision=revision)
    except Exception:  # a name the hub client refuses, an unreadable cache
        return None
    if not isinstance(found, str):
        return None
    return facts_in_folder(Path(found).parent, "the Hugging Face cache")


def facts_from_hub(repo: str, revision: str | None, cache_dir: Path | None = None) -> ModelFacts:
    """The facts of a Hub model read from the Hub: `config.json` (kept in the Hugging Face cache)
    and the weights' size from the safetensors headers (a few kilobytes, no weights downloaded).
    Raises the hub client's error where the Hub cannot be reached or the model is not there."""
    from huggingface_hub import get_safetensors_metadata, hf_hub_download

    path = hf_hub_download(repo, "config.json", revision=revision, cache_dir=cache_dir)
    config = json.loads(Path(path).read_text())
    weights: int | None = None
    try:
        metadata = get_safetensors_metadata(repo, revision=revision)
        weights = sum(
            count * SAFETENSORS_DTYPE_BYTES.get(dtype, 2) for dtype, count in metadata.parameter_count.items()
        )
    except Exception as error:  # no safetensors (a .bin checkpoint): the size stays a guess
        log.info("no safetensors sizes for %s: %s", repo, error)
    return ModelFacts(config if isinstance(config, dict) else None, weights or None, "the Hub")


def _text_model(config: dict[str, Any]) -> dict[str, Any]:
    """The text model's part of a config: nested under the thinker in Qwen2.5-Omni (the part vLLM
    serves), under text_config, llm_config or language_config (DeepSeek-VL2) in most VLMs, else
    the config itself."""
    config = config.get("thinker_config") or config
    return config.get("text_config") or config.get("llm_config") or config.get("language_config") or config


def _first(config: dict[str, Any], *names: str) -> Any:
    """The first of `names` the config sets (families name the same thing differently)."""
    return next((config[name] for name in names if config.get(name) is not None), None)


def parameters_from_config(config: dict[str, Any]) -> float | None:
    """Billions of parameters a `config.json` describes (text model: embeddings, attention and
    a gated MLP per layer; vision tower: about 12 x hidden^2 per layer), where no weights are on
    disk (`load_format="dummy"` folders)."""
    text = _text_model(config)
    try:
        hidden = int(text["hidden_size"])
        layers = int(_first(text, "num_hidden_layers", "num_layers", "n_layers"))
        heads = int(_first(text, "num_attention_heads", "n_heads", "num_heads"))
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


@dataclass(frozen=True)
class KvLayout:
    """The layers of a text model that keep a KV cache: each one's window (None: every token),
    the bytes per token of one layer at two bytes an element, and how many KV heads tensor
    parallelism can split them into (one for latent attention, whose vector every GPU keeps)."""

    windows: list[int | None]
    per_layer: int
    kv_heads: int


def kv_layout(config: dict[str, Any]) -> KvLayout | None:
    """What a `config.json` says of the text model's KV cache; None where it cannot be read."""
    text = _text_model(config)
    try:
        layers = int(_first(text, "num_hidden_layers", "num_layers", "n_layers"))
        shared = int(text.get("num_kv_shared_layers") or 0)
        if text.get("kv_lora_rank") and text.get("use_mla", True):
            # Multi-head latent attention (DeepSeek-V2 style): one compressed vector and the
            # rotary part of the key per token and layer, not keys and values per head.
            per_layer, kv_heads = (int(text["kv_lora_rank"]) + int(text.get("qk_rope_head_dim") or 0)) * 2, 1
        else:
            heads = int(_first(text, "num_attention_heads", "n_heads", "num_heads"))
            # ChatGLM names its KV heads `multi_query_group_num` and their size `kv_channels`;
            # Step3 `num_attention_groups`.
            names = ("num_key_value_heads", "multi_query_group_num", "num_kv_heads", "num_attention_groups")
            kv_heads = int(_first(text, *names) or heads)
            head_dim = int(_first(text, "head_dim", "kv_channels") or int(text["hidden_size"]) // heads)
            per_layer = 2 * kv_heads * head_dim * 2
        windows = sliding_windows(text, layers)
    except (KeyError, TypeError, ValueError, ZeroDivisionError):
        return None
    # Gemma 3n's last `num_kv_shared_layers` reuse earlier layers' cache.
    return KvLayout(windows[: max(1, layers - shared)], per_layer, max(1, kv_heads))


def sliding_windows(text: dict[str, Any], layers: int) -> list[int | None]:
    """Each layer's attention window (None: it attends to every token), as the config says:
    `layer_types` where given (Llama 4's chunked layers hold a chunk), else a window for every
    layer (Mistral style) or for all but every `sliding_window_pattern`-th (older Gemma 3
    configs); `use_sliding_window: false` (Qwen2) none."""
    window = text.get("sliding_window")
    chunk = text.get("attention_chunk_size")
    types = text.get("layer_types")
    if isinstance(types, list) and len(types) == layers:
        windows = {"sliding_attention": window, "chunked_attention": chunk}
        return [w if isinstance(w := windows.get(kind), int) and w > 0 else None for kind in types]
    if not isinstance(window, int) or window <= 0 or text.get("use_sliding_window") is False:
        return [None] * layers
    pattern = _first(text, "sliding_window_pattern", "_sliding_window_pattern")
    if isinstance(pattern, int) and pattern > 0:
        return [None if (i + 1) % pattern == 0 else window for i in range(layers)]
    return [window] * layers


def kv_bytes_per_token(config: dict[str, Any], dtype_bytes: int = 2) -> int | None:
    """Key and value bytes per token for every layer of the text model a `config.json` describes
    that keeps a cache (each counted in full, as for a sequence shorter than any window)."""
    layout = kv_layout(config)
    return len(layout.windows) * layout.per_layer * dtype_bytes // 2 if layout else None


def kv_bytes_per_sequence(
    config: dict[str, Any],
    tokens: int,
    dtype_bytes: int = 2,
    batched_tokens: int = DEFAULT_MAX_NUM_BATCHED_TOKENS,
) -> int | None:
    """KV bytes vLLM needs for one sequence of `tokens` tokens, as vLLM 0.32 counts a layer's
    most (`max_memory_usage_bytes`): a full-attention layer every token, a sliding-window (or
    chunked) layer its window plus the tokens of two steps in flight (asynchronous scheduling)
    and a block more; each rounded up to whole blocks. Where layers of several kinds share the
    cache, vLLM pads their pages to one size: a twentieth more is reserved for it."""
    layout = kv_layout(config)
    if layout is None:
        return None
    per_layer = layout.per_layer * dtype_bytes // 2

    def held(window: int | None) -> int:
        if window is None:
            return -(-tokens // KV_BLOCK_TOKENS) * KV_BLOCK_TOKENS
        held = min(tokens, window - 1 + 2 * batched_tokens)
        return (-(-held // KV_BLOCK_TOKENS) + 1) * KV_BLOCK_TOKENS

    total = sum(per_layer * held(window) for window in layout.windows)
    return total + total // 20 if len(set(layout.windows)) > 1 else total


# Where a config states the model's context (vLLM reads the same keys and takes the smallest).
CONTEXT_KEYS = (
    "max_position_embeddings",
    "n_positions",
    "max_seq_len",
    "seq_length",
    "max_sequence_length",
    "max_seq_length",
    "seq_len",
)


def native_context(config: dict[str, Any]) -> int | None:
    """The context the model was made for, as its text model's config states it, read as vLLM
    derives its limit: the smallest of the keys it reads (`model_max_length` too), and for
    Phi-3's long-rope scaling the original context (above it vLLM switches every sequence to the
    long factors, which it warns degrade short ones)."""
    text = _text_model(config)
    keys = (*CONTEXT_KEYS, "model_max_length")
    found = [int(v) for k in keys if isinstance(v := text.get(k), int) and v > 0]
    rope = text.get("rope_scaling") or text.get("rope_parameters") or {}
    if isinstance(rope, dict) and (rope.get("rope_type") or rope.get("type")) in ("longrope", "su"):
        key = "original_max_position_embeddings"
        original = text.get(key) or rope.get(key)
        if isinstance(original, int) and original > 0:
            found.append(original)
    return min(found) if found else None


def chat_length(
    card: ModelCard,
    config: dict[str, Any] | None,
    weights_bytes: int,
    wanted: int,
    fits: Callable[[int], bool] | None = None,
) -> int | None:
    """The `max_model_len` a chat gets on a GPU: `wanted` tokens (APP_CHAT_CONTEXT) where the
    model's config allows them, halved while the KV reserve for them would outweigh the weights
    (a model without grouped-query attention: Phi-3.5-vision's 16,384 tokens would take 12 GiB)
    or the engine would not `fits` the GPU's budget at that length (a 7B model on a 24 GB card),
    never fewer than the card's own (the references' single-image examples), nor, for a card
    that leaves the length to vLLM, than 4,096 (vLLM would take the model's whole context). The
    card's where there is no config, or the config states no context."""
    own = card.max_model_len
    native = native_context(config) if config is not None else None
    if config is None or native is None:
        return own
    floor = own or min(native, DEFAULT_MAX_MODEL_LEN)
    sequences = int(card.engine_args.get("max_num_seqs") or DEFAULT_MAX_NUM_SEQS)
    length = min(native, wanted)
    while length > floor:
        per_sequence = kv_bytes_per_sequence(config, length, kv_dtype_bytes(card), batched_tokens(card))
        small = per_sequence is not None and per_sequence * sequences <= weights_bytes
        if small and (fits is None or fits(length)):
            return length
        length //= 2
    return floor


def batched_tokens(card: ModelCard) -> int:
    """The most tokens one engine step takes (`max_num_batched_tokens`), the card's or a default."""
    return int(card.engine_args.get("max_num_batched_tokens") or DEFAULT_MAX_NUM_BATCHED_TOKENS)


def kv_dtype_bytes(card: ModelCard) -> int:
    """Bytes per element of the KV cache: FP8 where the card asks for it, four for a float32
    model, else two (vLLM serves float32 checkpoints in 16 bits unless told otherwise)."""
    args = card.engine_args
    if str(args.get("kv_cache_dtype", "auto")).startswith("fp8"):
        return 1
    return 4 if str(args.get("dtype", "auto")) in ("float32", "float") else 2


def estimate_need(
    card: ModelCard,
    folder: Path | None,
    on_gpu: bool,
    cpu_kv_cache_bytes: int = 0,
    facts: ModelFacts | None = None,
    chat_context: int | None = None,
    media_cache_bytes: int = 0,
    device_budget: int | None = None,
) -> MemoryNeed:
    """The footprint of `card`'s engine. `folder` is the model's local copy where there is one;
    `facts`, what was read of a Hub model (its cache, or the Hub itself) where there is none;
    `chat_context`, the context a chat gets on a GPU where the config allows (`chat_length`) and
    the engine still fits `device_budget`, the bytes engines may take of one GPU."""
    args = card.engine_args
    folder = folder or (Path(args["model"]) if Path(str(args.get("model", ""))).is_absolute() else None)
    if folder is not None:
        facts = facts_in_folder(folder) or facts
    config = facts.config if facts is not None else None
    weights = facts.weights_bytes if facts is not None else None
    weights_from = f"safetensors in {facts.source}" if facts is not None and weights else ""
    if weights is None:
        # A local folder without weights (vLLM's dummy weights) is the model its config says
        # (the count leaves out mixture-of-experts layers: not for a Hub model, which has the
        # card's figure or its name); elsewhere the card's figure or the repository's name.
        params = parameters_from_config(config) if folder is not None and config is not None else None
        weights_from = "config.json's parameters" if params else ""
        if not params and card.parameters_b:
            params, weights_from = card.parameters_b, "the card's parameters_b"
        if not params:
            params = parameters_from_name(card.hf_repo)
            weights_from = "the repository's name" if params else ""
        if params:
            weights = int(params * 1e9 * bytes_per_parameter(card))
        else:
            # The CPU backend only serves small models (the demo's, the twins').
            weights = UNKNOWN_WEIGHTS_BYTES if on_gpu else UNKNOWN_CPU_WEIGHTS_BYTES
            weights_from = "a default for unknown models"
    weights_known = weights_from.startswith(("safetensors", "config"))
    if not on_gpu:
        # The CPU backend's KV cache is the fixed size the app gives it; the engine process also
        # keeps vLLM's cache of processed pictures and videos, up to its bound, in the same RAM.
        return MemoryNeed(
            weights,
            cpu_kv_cache_bytes,
            CPU_ENGINE_OVERHEAD_BYTES + media_cache_bytes,
            1,
            weights_from,
            "the CPU KV cache setting",
            from_files=weights_known,
        )
    sequences = int(args.get("max_num_seqs") or DEFAULT_MAX_NUM_SEQS)
    batched = batched_tokens(card)
    devices = card.gpus_needed
    # Tensor parallelism splits the KV cache by heads; where there are fewer KV heads than GPUs
    # (or one latent vector) vLLM keeps copies, so each GPU holds at least one head's share.
    layout = kv_layout(config) if config is not None else None
    kv_devices = min(devices, layout.kv_heads) if layout is not None else devices

    def need_at(context: int | None) -> MemoryNeed:
        length = context or DEFAULT_MAX_MODEL_LEN
        per_sequence = (
            kv_bytes_per_sequence(config, length, kv_dtype_bytes(card), batched) if config else None
        )
        kv_from, reserve = "config.json", (per_sequence or 0) * sequences
        if per_sequence is None:
            # A guess: one full-length sequence at a per-token size that covers the catalog's
            # models without grouped-query attention (vLLM refuses an engine that cannot hold
            # one); vLLM then sizes the cache itself within the engine's share, so more sequences
            # fit where the model needs less.
            per_token = min(MAX_GUESSED_KV_BYTES_PER_TOKEN, int(weights * KV_BYTES_PER_TOKEN_PER_WEIGHT_BYTE))
            reserve = max(1, per_token) * length
            kv_from = "a guess for one sequence (no config at hand)"
        return MemoryNeed(
            weights,
            reserve,
            GPU_ENGINE_OVERHEAD_BYTES,
            devices,
            weights_from,
            kv_from,
            from_files=weights_known and kv_from == "config.json",
            context_tokens=context,
            kv_devices=kv_devices if per_sequence is not None else devices,
        )

    context = card.max_model_len
    if chat_context:

        def fits(length: int) -> bool:
            return device_budget is None or need_at(length).per_device <= device_budget

        context = chat_length(card, config, weights, chat_context, fits)
    return need_at(context)
