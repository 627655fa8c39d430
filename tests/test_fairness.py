"""The answers one visitor may have running at once (`app.views.fairness`), by hypothesis: random
visitors, some without a cookie, start and end answers in any order, some ending in an error."""

from __future__ import annotations

import contextlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.domain.conversation import ConversationError
from app.domain.sessions import Visit
from app.views.fairness import NO_COOKIE, Allowance

VISITORS = ["a" * 32, "b" * 32, NO_COOKIE]


@given(
    limit=st.integers(1, 3),
    steps=st.lists(st.tuples(st.booleans(), st.sampled_from(VISITORS), st.booleans()), max_size=60),
)
def test_no_visitor_runs_more_than_its_allowance_and_every_end_gives_one_back(limit, steps):
    allowance = Allowance(limit)
    running: dict[str, list[contextlib.ExitStack]] = {key: [] for key in VISITORS}
    for start, who, fails in steps:
        if start:
            held = contextlib.ExitStack()
            try:
                held.enter_context(allowance.held(Visit(counted_as=who)))
            except ConversationError as refused:
                # Refused exactly when full, in one line that names no one.
                assert len(running[who]) == limit and "\n" not in str(refused)
                assert ("no cookie" in str(refused)) == (who == NO_COOKIE)
                continue
            running[who].append(held)
        elif running[who]:
            held = running[who].pop(0)
            if fails:  # an answer that ends in an error still gives its place back
                with pytest.raises(RuntimeError), held:
                    raise RuntimeError("the engine died")
            else:
                held.close()
        assert {k: n for k, n in allowance.running.items()} == {k: len(v) for k, v in running.items() if v}
    for stacks in running.values():
        for held in stacks:
            held.close()
    assert not allowance.running
