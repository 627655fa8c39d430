"""The arena's leaderboard (`app.domain.leaderboard`): Bradley–Terry scores with bootstrap intervals.
Properties over random votes, and recovery of known strengths from simulated battles."""

from __future__ import annotations

import math
import random

from hypothesis import given, settings
from hypothesis import strategies as st

from app.domain.leaderboard import MIN_VOTES, leaderboard, table
from app.storage.votes import OUTCOMES, Vote

MODELS = ["alpha", "beta", "gamma", "delta"]
FLIPPED = {"a": "b", "b": "a", "tie": "tie", "bad": "bad"}
votes_strategy = st.lists(
    st.builds(Vote, st.sampled_from(MODELS), st.sampled_from(MODELS), st.sampled_from(OUTCOMES)),
    max_size=60,
)


def credit(vote: Vote, model: str) -> float:
    """What a vote gives `model`: a win 1, a tie or "both bad" a half, a loss nothing."""
    if vote.outcome in ("tie", "bad"):
        return 0.5
    return 1.0 if (vote.model_a if vote.outcome == "a" else vote.model_b) == model else 0.0


def scores(votes: list[Vote], rounds: int = 0) -> dict[str, float]:
    return {row.model: row.score for row in leaderboard(votes, rounds=rounds)}


@settings(max_examples=60, deadline=None)
@given(votes=votes_strategy, seed=st.integers(0, 1000))
def test_scores_do_not_depend_on_the_votes_order_or_which_side_a_model_was_shown(
    votes: list[Vote], seed: int
):
    shuffled = votes[:]
    random.Random(seed).shuffle(shuffled)
    swapped = [Vote(v.model_b, v.model_a, FLIPPED[v.outcome]) for v in votes]  # type: ignore[arg-type]
    expected = scores(votes)
    for other in (scores(shuffled), scores(swapped)):
        assert other.keys() == expected.keys()
        assert all(math.isclose(other[m], expected[m], abs_tol=1e-6) for m in expected)


@settings(max_examples=40, deadline=None)
@given(votes=votes_strategy)
def test_counts_win_rates_and_intervals_hold_for_any_votes(votes: list[Vote]):
    rows = leaderboard(votes, rounds=50)
    played = [v for v in votes if v.model_a != v.model_b]
    assert {r.model for r in rows} == {m for v in played for m in (v.model_a, v.model_b)}
    assert [r.score for r in rows] == sorted((r.score for r in rows), reverse=True)
    for row in rows:
        mine = [v for v in played if row.model in (v.model_a, v.model_b)]
        won = sum(credit(v, row.model) for v in mine)
        assert row.votes == len(mine) and math.isclose(row.wins, won)
        assert 0 <= row.win_rate <= 1 and math.isfinite(row.score)
        assert row.low <= row.high


def test_a_model_that_always_wins_leads_with_a_finite_score():
    votes = [Vote("alpha", other, "a") for other in ("beta", "gamma") for _ in range(20)]
    votes += [Vote("beta", "gamma", "tie")] * 5
    rows = leaderboard(votes, rounds=100)
    assert rows[0].model == "alpha" and math.isfinite(rows[0].score)
    assert rows[0].low > max(r.high for r in rows[1:])  # clearly ahead, even in the bootstrap
    assert rows[0].win_rate == 1.0


def test_known_strengths_are_recovered_from_simulated_battles():
    """Battles drawn from a Bradley–Terry model: the order comes back, the gaps come back on
    the Elo scale (within a few points), and each interval holds its model's true score."""
    rng = random.Random(7)
    true = {"alpha": 200.0, "beta": 100.0, "gamma": 0.0, "delta": -150.0}  # Elo points
    votes = []
    for _ in range(20_000):
        a, b = rng.sample(MODELS, 2)
        p_a = 1 / (1 + 10 ** ((true[b] - true[a]) / 400))
        votes.append(Vote(a, b, "a" if rng.random() < p_a else "b"))
    rows = leaderboard(votes, rounds=300)
    assert [r.model for r in rows] == ["alpha", "beta", "gamma", "delta"]
    offset = sum(r.score for r in rows) / 4 - sum(true.values()) / 4
    for row in rows:
        assert abs(row.score - offset - true[row.model]) < 12, (row, true)
        assert row.low - 3 <= true[row.model] + offset <= row.high + 3


def test_one_vote_says_nothing_yet_the_two_models_share_a_rank_and_are_marked_provisional():
    rows = table(leaderboard([Vote("x", "y", "a")], rounds=200))
    assert [row["rank"] for row in rows] == [1, 1] and all(row["provisional"] for row in rows)
    # Enough votes that tell them apart: separate ranks, nothing provisional.
    votes = [Vote("x", "y", "a")] * 60 + [Vote("x", "y", "b")] * 5 + [Vote("y", "z", "tie")] * 30
    ranked = {row["model"]: row for row in table(leaderboard(votes, rounds=200))}
    assert ranked["x"]["rank"] == 1 and ranked["y"]["rank"] == 2 and not ranked["x"]["provisional"]


@given(
    votes=st.lists(
        st.builds(Vote, st.sampled_from("pqrs"), st.sampled_from("pqrs"), st.sampled_from(OUTCOMES)),
        max_size=40,
    )
)
def test_a_provisional_model_ranks_first_and_pushes_no_model_down(votes: list[Vote]):
    rows = table(leaderboard(votes, rounds=50))
    for row in rows:
        if row["provisional"]:
            assert row["rank"] == 1
    settled = [row for row in rows if not row["provisional"]]
    assert all(row["rank"] <= 1 + len(settled) for row in rows)


@settings(max_examples=40, deadline=None)
@given(
    outcome=st.sampled_from(OUTCOMES),
    count=st.integers(MIN_VOTES, 400),
    others=st.lists(
        st.builds(Vote, st.sampled_from("pqr"), st.sampled_from("pqr"), st.sampled_from(OUTCOMES)),
        max_size=30,
    ),
)
def test_votes_all_one_way_still_leave_an_interval_not_a_point(outcome, count: int, others: list[Vote]):
    """Votes that all went one way (or were all ties) resample to themselves in every round: an
    interval of width 0 ("1520.6 to 1520.6") would claim a certainty no number of votes gives."""
    rows = table(leaderboard([Vote("x", "y", outcome)] * count + others, rounds=200))
    for row in rows:
        if not row["provisional"]:
            assert row["ci_low"] < row["ci_high"], row
    ranked = {row["model"]: row["rank"] for row in rows}
    if outcome in ("a", "b") and not others:
        # Ten votes out of ten do tell the two apart: separate ranks, the winner first.
        winner, loser = ("x", "y") if outcome == "a" else ("y", "x")
        assert (ranked[winner], ranked[loser]) == (1, 2)
