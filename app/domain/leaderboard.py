"""The arena's leaderboard from its votes: Bradley–Terry scores with bootstrap confidence
intervals, as LMArena publishes them, with vote counts and win rates.

A vote is (model A, model B, outcome): A won, B won, a tie, or both bad. Ties and "both bad"
count half a win to each side. Scores are on the Elo scale (400 points: ten to one odds,
centred on 1000). Votes are first summed per pair and outcome, so the cost of a fit does not
grow with the number of votes, and every bootstrap round is a multinomial draw over those sums:
1,000 rounds over 100,000 votes take a fraction of a second. numpy only; no database here.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from app.domain.exports import csv_text
from app.storage.votes import Vote, pair_of

SCALE, CENTRE = 400 / math.log(10), 1000.0
# A virtual tie of this weight between every two models: keeps a model that never lost (or
# never won) at a finite score, and models never compared on one scale.
PRIOR = 0.05


@dataclass(frozen=True)
class Row:
    model: str
    score: float
    low: float  # the bootstrap's 2.5th percentile
    high: float  # its 97.5th
    votes: int
    wins: float  # ties count half
    win_rate: float


def fit(wins: np.ndarray, iterations: int = 200, tolerance: float = 1e-9) -> np.ndarray:
    """Bradley–Terry strengths from win matrices: `wins[..., i, j]` is how often i beat j
    (several matrices at once along the leading axes). Hunter's MM algorithm; log-strengths
    centred on 0 per matrix."""
    models = wins.shape[-1]
    wins = wins + PRIOR / 2 * (1 - np.eye(models))
    games = wins + np.swapaxes(wins, -1, -2)
    won = wins.sum(axis=-1)
    strength = np.ones(wins.shape[:-1])
    for _ in range(iterations):
        pair = strength[..., :, None] + strength[..., None, :]
        updated = won / (games / pair).sum(axis=-1)
        updated /= np.exp(np.log(updated).mean(axis=-1, keepdims=True))
        done = np.abs(updated - strength).max() < tolerance
        strength = updated
        if done:
            break
    return np.log(strength)


def contributions(models: Sequence[str], cells: Sequence[Vote]) -> np.ndarray:
    """What one vote of each kind adds to the win matrix: shape (cells, models, models)."""
    index = {model: i for i, model in enumerate(models)}
    added = np.zeros((len(cells), len(models), len(models)))
    for cell, vote in enumerate(cells):
        a, b = index[vote.model_a], index[vote.model_b]
        if vote.outcome == "a":
            added[cell, a, b] = 1
        elif vote.outcome == "b":
            added[cell, b, a] = 1
        else:
            added[cell, a, b] = added[cell, b, a] = 0.5
    return added


def leaderboard(votes: Iterable[Vote], rounds: int = 1000, seed: int = 0) -> list[Row]:
    """One row per model that has votes, the best first."""
    counts = Counter(v for v in votes if v.model_a != v.model_b)
    models = sorted({m for v in counts for m in (v.model_a, v.model_b)})
    if not models:
        return []
    cells = list(counts)
    added = contributions(models, cells)
    tally = np.array([counts[c] for c in cells], dtype=float)
    wins = np.einsum("c,cij->ij", tally, added)
    scores = CENTRE + SCALE * fit(wins)
    low, high = scores, scores
    if rounds:
        # Each round draws as many votes as there are, with replacement: a multinomial over
        # the distinct (pair, outcome) cells. Votes that all went one way (or all ties) would
        # draw themselves every round, an interval of width 0 however few they are: each pair
        # played also has half a vote for each side in what is drawn from (not in the score).
        pairs = sorted({pair_of(v.model_a, v.model_b) for v in cells})
        unseen = [Vote(a, b, outcome) for a, b in pairs for outcome in ("a", "b")]
        drawn = np.concatenate([added, contributions(models, unseen)])
        weights = np.concatenate([tally, np.full(len(unseen), 0.5)])
        total = int(tally.sum())
        draws = np.random.default_rng(seed).multinomial(total, weights / weights.sum(), size=rounds)
        bootstrap = CENTRE + SCALE * fit(np.einsum("rc,cij->rij", draws.astype(float), drawn))
        low, high = np.percentile(bootstrap, [2.5, 97.5], axis=0)
    played = wins + wins.T
    rows = [
        Row(
            model=model,
            score=float(scores[i]),
            low=float(low[i]),
            high=float(high[i]),
            votes=round(played[i].sum()),
            wins=float(wins[i].sum()),
            win_rate=float(wins[i].sum() / played[i].sum()) if played[i].sum() else 0.0,
        )
        for i, model in enumerate(models)
    ]
    return sorted(rows, key=lambda row: row.score, reverse=True)


COLUMNS = (
    "rank",
    "model",
    "name",
    "score",
    "ci_low",
    "ci_high",
    "votes",
    "wins",
    "win_rate",
    "provisional",
)
# Below this many votes a model's bootstrap interval says nothing (one vote resampled is that
# vote a thousand times: an interval of width 0): it is marked provisional and ranks with all.
MIN_VOTES = 10


def table(rows: Sequence[Row], names: Mapping[str, str] | None = None) -> list[dict[str, object]]:
    """The leaderboard as exported and shown. A model's rank is one more than the number of
    models whose interval lies wholly above its own (as LMArena ranks): models the votes cannot
    tell apart share a rank. A provisional model (fewer than `MIN_VOTES` votes) is told apart
    from none: it shares the first rank, and puts no model below it."""
    names = names or {}

    def settled(row: Row) -> bool:
        return row.votes >= MIN_VOTES

    return [
        {
            "rank": 1 + sum(other.low > row.high for other in rows if settled(other) and settled(row)),
            "model": row.model,
            "name": names.get(row.model, row.model),
            "score": round(row.score, 1),
            "ci_low": round(row.low, 1),
            "ci_high": round(row.high, 1),
            "votes": row.votes,
            "wins": row.wins,
            "win_rate": round(row.win_rate, 4),
            "provisional": not settled(row),
        }
        for row in rows
    ]


def to_csv(records: Sequence[Mapping[str, object]]) -> str:
    return csv_text(COLUMNS, records)
