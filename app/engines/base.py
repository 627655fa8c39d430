"""What an engine is, to the manager and the views: the `Engine` and `EngineFactory` protocols,
the sampling settings a request carries (checked here, so that a bad value is refused in one line
before any engine sees it), what a stream yields, the engine errors meant for users, and the
lines that explain an engine's refusals."""

from __future__ import annotations

import math
import re
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any, Protocol

from app.catalog.cards import ModelCard
from app.engines.memory import MemoryNeed
from app.engines.scheduler import Capacity


class EngineError(RuntimeError):
    """An answer or a build that failed; the message is meant for the user."""


class EngineFailure(EngineError):
    """The engine itself broke (its process died): the model is marked failed and rebuilt."""


class ModelState(StrEnum):
    NOT_LOADED = "not loaded"
    QUEUED = "queued"
    LOADING = "loading"
    READY = "ready"
    SLEEPING = "sleeping"
    UNLOADING = "unloading"
    FAILED = "failed"


@dataclass(frozen=True)
class ModelStatus:
    """What the UI shows about one model."""

    key: str
    state: ModelState
    phase: str = ""
    elapsed_s: float | None = None
    # How long the last build (or wake) of this model took, where known.
    estimate_s: float | None = None
    reason: str = ""
    in_flight: int = 0

    def describe(self) -> str:
        text = self.state.value
        if self.phase:
            text += f": {self.phase}"
        if self.state in (ModelState.LOADING, ModelState.QUEUED) and self.elapsed_s is not None:
            text += f" ({self.elapsed_s:.0f} s"
            text += f" of about {self.estimate_s:.0f} s)" if self.estimate_s else ")"
        if self.reason:
            text += f": {self.reason}"
        return text


@dataclass(frozen=True)
class SamplingSettings:
    """A request's sampling; `None` takes the model card's `sampling_defaults`, then the app's."""

    temperature: float | None = None
    top_p: float | None = None
    max_tokens: int | None = None
    seed: int | None = None
    # Fixed-length answers, for benchmarks and tests on random weights.
    ignore_eos: bool = False

    def for_card(self, card: ModelCard | None) -> SamplingSettings:
        """Every value filled: the user's, else the card's default, else the app's."""
        given = card.sampling_defaults if card is not None else {}
        card_defaults = {k: v for k, v in given.items() if k in APP_SAMPLING_DEFAULTS}
        chosen = {
            k: v
            for k, v in (
                ("temperature", self.temperature),
                ("top_p", self.top_p),
                ("max_tokens", self.max_tokens),
            )
            if v is not None
        }
        return replace(self, **{**APP_SAMPLING_DEFAULTS, **card_defaults, **chosen})

    def check(self) -> None:
        """Refuses values the engine would refuse (vLLM's own rules), with one line that names
        the setting, its value and the range to pick from."""
        for name in ("temperature", "top_p", "max_tokens", "seed"):
            value = getattr(self, name)
            if value is not None and not SAMPLING_RULES[name][0](value):
                raise SamplingError(sampling_refusal(name, value))


APP_SAMPLING_DEFAULTS: dict[str, Any] = {"temperature": 0.7, "top_p": 1.0, "max_tokens": 512}

# The largest answer length asked for that the engine can carry (a 32-bit count).
MAX_TOKENS_LIMIT = 2**31 - 1
# vLLM seeds a 64-bit generator and sends the seed as a 64-bit integer.
SEED_LIMIT = 2**64 - 1


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _whole(value: Any) -> bool:
    return _number(value) and float(value).is_integer()


# Each sampling value's test and the range a user picks from (vLLM's `SamplingParams` rules).
SAMPLING_RULES: dict[str, tuple[Callable[[Any], bool], str, str]] = {
    "temperature": (lambda v: _number(v) and 0 <= v <= 2, "Temperature", "from 0 to 2"),
    "top_p": (lambda v: _number(v) and 0 < v <= 1, "Top-p", "above 0 and at most 1"),
    "max_tokens": (
        lambda v: _whole(v) and 1 <= v <= MAX_TOKENS_LIMIT,
        "Max tokens",
        f"a whole number from 1 to {MAX_TOKENS_LIMIT:,}",
    ),
    "seed": (
        lambda v: _whole(v) and 0 <= v <= SEED_LIMIT,
        "The seed",
        f"a whole number from 0 to {SEED_LIMIT:,} (or empty for a random one)",
    ),
}


class SamplingError(EngineError):
    """A sampling value out of range; the message names it and the range."""


def sampling_refusal(name: str, value: Any) -> str:
    """One line for a sampling value the engine refuses: what it is and what it may be."""
    _, label, allowed = SAMPLING_RULES[name]
    shown = f"{value:,}" if isinstance(value, int) and not isinstance(value, bool) else str(value)
    return f"{label} is {shown[:40]}; it must be {allowed}: change it and send again."


def length_refusal(
    card_name: str, prompt_tokens: int, limit: int, at_least: bool = False, answer_tokens: int = 0
) -> str:
    """One line for a prompt (with the answer asked for) longer than the model's context."""
    size = f"at least {prompt_tokens:,}" if at_least else f"{prompt_tokens:,}"
    if answer_tokens:
        return (
            f"The prompt is {size} tokens and the answer may take {answer_tokens:,}; {card_name} takes "
            f"at most {limit:,} (prompt plus answer): lower max tokens, shorten the prompt or start a "
            "new chat."
        )
    return (
        f"The prompt is {size} tokens; {card_name} takes at most {limit:,} (prompt plus answer): "
        "shorten it or start a new chat."
    )


_LENGTH = re.compile(
    r"maximum context length is (\d+) tokens.*?(?:contains|has) (at least )?(\d+)", re.DOTALL
)
# An older server's wording: "you requested 5000 tokens (4000 in the messages, 1000 in the completion)".
_LENGTH_SPLIT = re.compile(
    r"maximum context length is (\d+) tokens.*?requested \d+ tokens \((\d+) in the messages, "
    r"(\d+) in the completion",
    re.DOTALL,
)
_SAMPLING = re.compile(r"^(temperature|top_p|max_tokens|seed)\b.*?got (-?[\w.+]+?)\.?(?:\s|$)")


def explain_refusal(card_name: str, message: str, counted: int | None = None) -> str | None:
    """The user's line for an engine's refusal (vLLM's validation message, in this process or
    from a server's 400 answer), or None where the message is not one the app knows.
    `counted`: the prompt's size as the app counted it (vLLM stops counting one past the limit)."""
    split = _LENGTH_SPLIT.search(message)
    if split:
        limit, tokens, answer = (int(g) for g in split.groups())
        return length_refusal(card_name, max(tokens, counted or 0), limit, answer_tokens=answer)
    length = _LENGTH.search(message)
    if length:
        limit, at_least, tokens = int(length.group(1)), bool(length.group(2)), int(length.group(3))
        if counted is not None and counted > tokens:
            return length_refusal(card_name, counted, limit)
        return length_refusal(card_name, tokens, limit, at_least)
    sampling = _SAMPLING.search(message.strip())
    if sampling:
        name, value = sampling.groups()
        return sampling_refusal(name, value)
    return None


def card_sampling(card: ModelCard) -> SamplingSettings:
    """The sampling a model starts with in the UI and the API: its card's defaults over the app's."""
    return SamplingSettings().for_card(card)


@dataclass(frozen=True)
class TextDelta:
    text: str


@dataclass(frozen=True)
class StreamEnd:
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int
    # The prompt as the engine saw it (for a remote engine: the chat messages, media elided).
    prompt: str = ""


StreamEvent = ModelStatus | TextDelta | StreamEnd


class Engine(Protocol):
    """One model being served: an in-process vLLM engine, a remote server or a simulation."""

    @property
    def resident(self) -> bool:
        """Whether it holds this machine's memory (counts against the budget)."""
        ...

    @property
    def can_sleep(self) -> bool:
        """Whether it can be put to sleep (weights to host memory) instead of shut down."""
        ...

    @property
    def footprint_bytes(self) -> int | None:
        """What its build took on each device it is on (the most on any one), measured; None
        where nothing was measured (a remote server, the CPU backend)."""
        ...

    def generate(
        self, card: ModelCard, messages: Sequence[dict[str, Any]], sampling: SamplingSettings, request_id: str
    ) -> AsyncIterator[TextDelta | StreamEnd]: ...

    async def abort(self, request_id: str) -> None: ...

    def unfinished_requests(self) -> int: ...

    async def sleep(self) -> None: ...

    async def wake(self) -> None: ...

    async def shutdown(self) -> None:
        """Stops the engine and returns once its memory is back."""
        ...


class EngineFactory(Protocol):
    def capacity(self) -> Capacity:
        """Bytes engines may use on each device and, asleep, in host memory."""
        ...

    def memory_need(self, card: ModelCard) -> MemoryNeed | None:
        """The engine's footprint; None where it holds no memory here (a remote server)."""
        ...

    async def build(self, card: ModelCard, report: Callable[[str], None], devices: tuple[int, ...]) -> Engine:
        """Builds the engine for `card` on `devices`, calling `report` with each phase."""
        ...


def first_line(error: BaseException) -> str:
    """An error's first line, or its type's name when it has no message."""
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def failure_reason(card: ModelCard, error: BaseException) -> str:
    """One line naming the model and the cause."""
    detail = first_line(error)
    if isinstance(error, EngineError):
        return detail
    return f"{card.display_name} could not be loaded: {detail[:300]}"


class EngineEvents:
    """What the manager tells an observer as it works; this base, the manager's observer when
    nobody watches, does nothing (`app.engines.metrics` counts it for an operator). Every method
    returns at once and never raises into the manager."""

    def loaded(self, key: str, seconds: float, woke: bool) -> None: ...
    def load_failed(self, key: str) -> None: ...
    def slept(self, key: str, seconds: float) -> None: ...
    def unloaded(self, key: str, seconds: float) -> None: ...
    def waited(self, key: str, seconds: float) -> None: ...
    def answered(self, key: str, first_token_s: float | None, tokens: int, seconds: float) -> None: ...
