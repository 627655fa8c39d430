"""The arena's rules, apart from any page or engine: which two models battle, what a battle's
modality is, how a reply is shown without naming its model, and how often a browser may vote.

A battle is two models drawn from the operator's pool, shown as A and B in a random order. Pairs
with fewer votes are drawn more often (weight 1 / (1 + votes)), so a new model or a rare pair
catches up rather than the leaderboard's intervals staying wide where nobody looks.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from app.domain.conversation import ConversationError
from app.domain.replies import Reply
from app.storage.history import new_id
from app.storage.votes import Outcome

Modality = Literal["text", "image", "images", "video"]
MODALITIES: tuple[Modality, ...] = ("text", "image", "images", "video")
SIDES = ("A", "B")
VOTE_WINDOW_S = 3600.0
# What each vote button says, and what the reveal repeats.
VERDICTS: dict[Outcome, str] = {
    "a": "A is better",
    "b": "B is better",
    "tie": "It's a tie",
    "bad": "Both are bad",
}


class ArenaError(ConversationError):
    """A battle or a vote refused; the text is meant for the user and names no model."""


Pair = tuple[str, str]


def pair_weights(models: Sequence[str], votes: Mapping[Pair, int]) -> dict[Pair, float]:
    """Every pair of distinct `models`, weighted 1 / (1 + the votes it has had)."""
    unique = sorted(set(models))
    return {(a, b): 1.0 / (1 + votes.get((a, b), 0)) for i, a in enumerate(unique) for b in unique[i + 1 :]}


def draw_pair(models: Sequence[str], votes: Mapping[Pair, int], rng: random.Random) -> Pair:
    """Two distinct models from `models`, as (A, B) in a random order."""
    weights = pair_weights(models, votes)
    if not weights:
        raise ArenaError("The arena needs two models that take this message; this server has fewer.")
    pairs = list(weights)
    a, b = rng.choices(pairs, weights=[weights[p] for p in pairs])[0]
    return (a, b) if rng.random() < 0.5 else (b, a)


def modality_of(images: int, videos: int) -> Modality:
    """What a battle was about, from every file its turns sent: a clip makes it a video battle."""
    if videos:
        return "video"
    return "images" if images > 1 else "image" if images else "text"


@dataclass
class Battle:
    """Two models under letters. The conversation itself is the arena session's turns, each with
    one reply per side (`Turn.columns`, A first)."""

    keys: Pair  # (model A, model B)
    id: str = field(default_factory=new_id)
    outcome: Outcome | None = None  # set once, by the vote; the names are shown from then on

    @property
    def revealed(self) -> bool:
        return self.outcome is not None

    def side(self, key: str) -> str:
        return SIDES[self.keys.index(key)]


def blind(text: str, names: Mapping[str, str]) -> str:
    """`text` with every model name in `names` (name -> side letter) replaced by "Model X": an
    error or a waiting line must not tell which model is which."""
    for name in sorted(names, key=len, reverse=True):
        if name:
            text = text.replace(name, f"Model {names[name]}")
    return text


# Until the vote, a side that cannot take a message or fails says only this, in the same words
# for both: a refusal naming what a model takes, or its context length, gives the model away.
BLIND_REFUSAL = (
    "The two models of this battle cannot both take this message; start a new battle to draw "
    "two that can, or send it without some of its files."
)
BLIND_FAILURE = "This model could not answer this message."


def finished(replies: Iterable[Reply]) -> bool:
    """Whether every answer of a battle finished. One stopped or failed is no fair comparison (a
    vote on it would count): such a battle takes no vote, and the next message starts another."""
    return all(reply.state == "done" for reply in replies)


def blind_state(reply: Reply, revealed: bool = False) -> str:
    """How a side's answer goes, in words of its own (the scheduler's phases name no model since
    a hostile review, and these keep it so whatever they say): one model may wait while the other
    answers on the same GPU. Until the vote, an answer shows no token count nor speed: they
    fingerprint the model."""
    if reply.state == "done":
        if not revealed:
            return "done"
        speed = f" · {reply.tokens_per_s:.1f} tok/s" if reply.tokens_per_s is not None else ""
        return f"done · {reply.completion_tokens} tokens{speed}"
    if reply.state in ("stopped", "failed", "answering"):
        return reply.state
    if reply.state.startswith("loading"):
        return "loading its model"
    if reply.state == "ready":
        return "starting"
    return "waiting for its turn: the models here take turns"


def retry_after_s(
    vote_times: Iterable[float], limit: int, now: float, window_s: float = VOTE_WINDOW_S
) -> float:
    """Seconds until a browser that voted at `vote_times` may vote again (0: it may now)."""
    recent = sorted(t for t in vote_times if t > now - window_s)
    if len(recent) < limit:
        return 0.0
    return recent[len(recent) - limit] + window_s - now


def check_rate(vote_times: Iterable[float], limit: int, now: float, who: str = "You have") -> None:
    if (wait := retry_after_s(vote_times, limit, now)) > 0:
        minutes = max(1, round(wait / 60))
        raise ArenaError(
            f"{who} cast {limit} votes in the last hour, the most this server takes; "
            f"vote again in about {minutes} minute{'s' if minutes != 1 else ''}."
        )
