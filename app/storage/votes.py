"""A blind arena's vote as the history stores it, and what its outcomes mean (the leaderboard,
`app.domain.leaderboard`, reads them; storage keeps them)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Outcome = Literal["a", "b", "tie", "bad"]
OUTCOMES: tuple[Outcome, ...] = ("a", "b", "tie", "bad")


@dataclass(frozen=True)
class Vote:
    model_a: str
    model_b: str
    outcome: Outcome


def pair_of(a: str, b: str) -> tuple[str, str]:
    """A pair of models regardless of which side each was on."""
    return (a, b) if a <= b else (b, a)
