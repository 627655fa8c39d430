"""The model catalog: one strict YAML card per model in `model_cards/`.

A card says how vLLM must be built for a model (the reference's engine arguments, plus the
demo's documented overrides) and how a conversation is written into its prompt (the adapter it
names and that adapter's `prompt` section). Loading stops at the first bad card with the file
name in the message, so a broken catalog fails at start-up rather than mid-chat.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, model_validator

from app.catalog.adapters import Spec, parse_spec

CARDS_DIR = Path(__file__).resolve().parents[2] / "model_cards"

Modality = Literal["image", "video"]


class CardError(ValueError):
    """A model card that cannot be loaded; the message names the file."""


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class EngineOverrides(StrictModel):
    """Engine arguments the demo changes from the reference, and why."""

    args: dict[str, Any]
    why: str = Field(min_length=1)


class LoraAdapter(StrictModel):
    """A LoRA the model needs for images, shipped inside the model repository."""

    name: str
    id: int
    subpath: str


class VisualTokens(StrictModel):
    """How many prompt tokens an image or a video frame becomes, for the size check made before
    sending. Either a fixed count per image, or one token per `pixels_per_token` pixels of the
    image clamped to `min_pixels`..`max_pixels` (dynamic-resolution models such as Qwen2-VL).
    `frames_per_token` > 1 where the model merges consecutive video frames."""

    per_image: int | None = Field(None, ge=1)
    pixels_per_token: int | None = Field(None, ge=1)
    min_pixels: int = Field(0, ge=0)
    max_pixels: int | None = Field(None, ge=1)
    frames_per_token: int = Field(1, ge=1)

    @model_validator(mode="after")
    def _one_rule(self) -> VisualTokens:
        if (self.per_image is None) == (self.pixels_per_token is None):
            raise ValueError("give either per_image or pixels_per_token")
        return self

    def image_tokens(self, width: int, height: int) -> int:
        if self.per_image is not None:
            return self.per_image
        pixels = max(width * height, self.min_pixels)
        if self.max_pixels is not None:
            pixels = min(pixels, self.max_pixels)
        return -(-pixels // self.pixels_per_token)


# Qwen2-VL's processors: one token per 28x28 pixels, two frames merged into one.
QWEN_PATCH_PIXELS = 28 * 28
# Models whose card gives no rule: a typical fixed-resolution encoder (LLaVA-style models use 576).
DEFAULT_IMAGE_TOKENS = 256


class Grounding(StrictModel):
    """How the model writes boxes in its answers (`app.media.grounding`): the syntax its family
    documents, the frame its coordinates count in, and where that is documented."""

    syntax: Literal["qwen_json", "qwen2_tokens", "loc_tokens", "ref_box", "glm_box", "ref_det"]
    frame: Literal["pixels", "thousandths", "thousandths_999", "loc_bins"]
    # For the `pixels` frame: the side multiple of the processor's resize (28 for Qwen2.5-VL).
    resize_factor: int | None = Field(None, ge=1)
    documented_in: str = Field(min_length=1)

    @model_validator(mode="after")
    def _factor_for_pixels(self) -> Grounding:
        if (self.frame == "pixels") != (self.resize_factor is not None):
            raise ValueError("resize_factor is given exactly when the frame is pixels")
        return self


@dataclass(frozen=True)
class Availability:
    available: bool
    reasons: tuple[str, ...] = ()

    @property
    def reason(self) -> str:
        return "; ".join(self.reasons)


class ModelCard(StrictModel):
    key: str
    display_name: str
    family: str
    hf_repo: str
    revision: str | None = None
    architecture: str
    modalities: list[Modality] = Field(min_length=1)
    multi_image: bool = False
    reference: str
    reference_engine_args: dict[str, Any]
    engine_overrides: EngineOverrides | None = None
    lora: LoraAdapter | None = None
    stop_token_ids: list[int] = []
    stop_tokens: list[str] = []
    stop_on_eos_token: bool = False
    sampling_defaults: dict[str, Any] = {}
    # Total parameters in billions, where the repository's name does not say (for memory sizing).
    parameters_b: float | None = Field(None, gt=0)
    video_metadata: bool = False
    # Frames sampled from a video for this model: the references' `--num-frames` default.
    video_frames: int = Field(16, ge=1, le=64)
    adapter: str
    chat_template_owner: Literal["tokenizer", "processor"] = "tokenizer"
    prompt: dict[str, Any]
    hardware: str
    # Small enough for vLLM's CPU backend (the demo models): needs no GPU.
    runs_on_cpu: bool = False
    notes: str = ""
    # An OpenAI-compatible vLLM server (`.../v1`) that serves this model instead of this process.
    remote_url: str | None = None
    # Tokens per image or frame for the size check; by default derived from the engine arguments.
    visual_tokens: VisualTokens | None = None
    unsupported_reason: str | None = None
    # Boxes in its answers, drawn on the picture (models that ground objects).
    grounding: Grounding | None = None
    # For a model made on this machine (the demo models): where it comes from, in words. Its
    # `hf_repo` is then a folder on this server, which users are never shown.
    made_here: str | None = None

    _prompt_spec: Spec = PrivateAttr()

    @property
    def source(self) -> str:
        """Where the model comes from, as users are told: the repository (and revision)."""
        if self.made_here:
            return self.made_here
        return self.hf_repo + (f" @ {self.revision}" if self.revision else "")

    @model_validator(mode="after")
    def _consistent(self) -> ModelCard:
        if self.reference_engine_args.get("model") != self.hf_repo:
            raise ValueError("reference_engine_args.model must equal hf_repo")
        unknown = set(self.media_limits) - set(self.modalities)
        if unknown:
            raise ValueError(f"limit_mm_per_prompt names {sorted(unknown)}, not in modalities")
        missing = set(self.modalities) - set(self.media_limits)
        if missing:
            raise ValueError(f"modalities {sorted(missing)} have no limit_mm_per_prompt entry")
        self._prompt_spec = parse_spec(self.adapter, self.prompt, self.modalities)
        return self

    @property
    def prompt_spec(self) -> Spec:
        return self._prompt_spec

    @property
    def engine_args(self) -> dict[str, Any]:
        """Keyword arguments for vLLM's engine: the reference's, with the demo's overrides."""
        args = dict(self.reference_engine_args)
        if self.engine_overrides is not None:
            args.update(self.engine_overrides.args)
        if self.revision is not None:
            args["revision"] = self.revision
        return args

    @property
    def media_limits(self) -> dict[str, int]:
        return dict(self.engine_args.get("limit_mm_per_prompt", {}))

    @property
    def takes_system_prompt(self) -> bool:
        """Whether the prompt format has a system prompt (chat templates always do)."""
        return getattr(self.prompt_spec, "system", "") is not None

    @property
    def max_model_len(self) -> int | None:
        value = self.engine_args.get("max_model_len")
        return int(value) if value is not None else None

    @property
    def visual_token_rule(self) -> VisualTokens:
        """The card's own rule, else Qwen's where the processor is given a pixel range, else a
        fixed typical count."""
        if self.visual_tokens is not None:
            return self.visual_tokens
        kwargs = self.engine_args.get("mm_processor_kwargs") or {}
        if "max_pixels" in kwargs:
            return VisualTokens(
                pixels_per_token=QWEN_PATCH_PIXELS,
                min_pixels=int(kwargs.get("min_pixels", 4 * QWEN_PATCH_PIXELS)),
                max_pixels=int(kwargs["max_pixels"]),
                frames_per_token=2,
            )
        return VisualTokens(per_image=DEFAULT_IMAGE_TOKENS)

    @property
    def gpus_needed(self) -> int:
        args = self.engine_args
        return int(args.get("tensor_parallel_size", 1)) * int(args.get("pipeline_parallel_size", 1))

    @property
    def needs_remote_code(self) -> bool:
        return bool(self.engine_args.get("trust_remote_code", False))

    @property
    def multi_turn(self) -> bool:
        return bool(getattr(self.prompt_spec, "multi_turn", True))

    def availability(self, gpu_count: int, allow_remote_code: bool, remote: bool = False) -> Availability:
        """Whether this machine and the operator's settings can serve the model, and why not.

        A model served by a remote server (`remote_url`, or `remote=True` from the settings)
        needs neither local GPUs nor local permission for remote code: that server decides."""
        reasons = []
        if self.unsupported_reason:
            reasons.append(self.unsupported_reason)
        if remote or self.remote_url:
            return Availability(not reasons, tuple(reasons))
        if self.gpus_needed > gpu_count and not (self.runs_on_cpu and gpu_count == 0):
            reasons.append(gpu_shortage(self.gpus_needed, gpu_count))
        if self.needs_remote_code and not allow_remote_code:
            reasons.append(
                "runs code from its model repository (trust_remote_code); "
                "the operator has not allowed that (APP_ALLOW_REMOTE_CODE=1)"
            )
        return Availability(not reasons, tuple(reasons))


def gpu_shortage(needed: int, present: int) -> str:
    """Why a model does not fit this machine's GPUs, in words (no "1 GPUs", no "has 0")."""
    need = "an NVIDIA GPU" if needed == 1 else f"{needed} NVIDIA GPUs (tensor_parallel_size {needed})"
    have = "none" if present == 0 else f"only {present}"
    return f"needs {need}; this machine has {have}"


def validation_problems(error: ValidationError, whole: str) -> str:
    """A strict model's refusal in one line: each field at fault and why (`whole` names the
    thing itself, for problems that belong to no one field)."""
    return "; ".join(f"{'.'.join(str(p) for p in e['loc']) or whole}: {e['msg']}" for e in error.errors())


def load_card(path: Path) -> ModelCard:
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as error:
        raise CardError(f"{path.name}: not valid YAML: {error}") from None
    if not isinstance(data, dict):
        raise CardError(f"{path.name}: a card must be a mapping of fields")
    try:
        card = ModelCard.model_validate(data)
    except ValidationError as error:
        raise CardError(f"{path.name}: {validation_problems(error, 'card')}") from None
    if card.key != path.stem:
        raise CardError(f"{path.name}: key {card.key!r} differs from the file name {path.stem!r}")
    return card


def load_cards(path: str | Path | None = None) -> dict[str, ModelCard]:
    """All cards of a folder (default: the project's `model_cards/`), keyed by reference key."""
    folder = Path(path) if path is not None else CARDS_DIR
    files = sorted(folder.glob("*.yaml"))
    if not files:
        raise CardError(f"no model cards (*.yaml) in {folder}")
    return {card.key: card for card in map(load_card, files)}


def servable_cards(
    cards: dict[str, ModelCard], gpu_count: int, allow_remote_code: bool, remote_keys: Iterable[str] = ()
) -> dict[str, ModelCard]:
    """The cards that this machine and operator setting can serve (here or on a remote server)."""
    remote = set(remote_keys)
    return {
        key: card
        for key, card in cards.items()
        if card.availability(gpu_count, allow_remote_code, key in remote).available
    }
