"""The answers one client may have running at once (`app.views.fairness`), by hypothesis: random
visitors at random addresses start and end answers in any order, some ending in an error."""

from __future__ import annotations

import contextlib
from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.domain.conversation import ConversationError
from app.domain.sessions import Visit
from app.views.fairness import Allowance

CLIENTS = [(visitor * 32, address) for visitor in "abc" for address in ("203.0.113.1", "198.51.100.2")]


@given(
    per_visitor=st.integers(1, 3),
    per_address=st.integers(1, 4),
    steps=st.lists(st.tuples(st.booleans(), st.sampled_from(CLIENTS), st.booleans()), max_size=60),
)
def test_no_visitor_nor_address_runs_past_its_allowance_and_every_end_gives_its_place_back(
    per_visitor, per_address, steps
):
    allowance = Allowance(per_visitor, per_address)
    running: list[tuple[tuple[str, str], contextlib.ExitStack]] = []
    for start, (visitor, address), fails in steps:
        visitors = Counter(v for (v, _), _ in running)
        addresses = Counter(a for (_, a), _ in running)
        if start:
            held = contextlib.ExitStack()
            try:
                held.enter_context(allowance.held(Visit(counted_as=visitor, address=address)))
            except ConversationError as refused:
                # Refused exactly when one of the two is full, in one line that names no one.
                assert visitors[visitor] == per_visitor or addresses[address] == per_address
                assert "\n" not in str(refused) and address not in str(refused)
                continue
            assert visitors[visitor] < per_visitor and addresses[address] < per_address
            running.append(((visitor, address), held))
        else:
            mine = [entry for entry in running if entry[0] == (visitor, address)]
            if not mine:
                continue
            running.remove(mine[0])
            if fails:  # an answer that ends in an error still gives its place back
                with pytest.raises(RuntimeError), mine[0][1]:
                    raise RuntimeError("the engine died")
            else:
                mine[0][1].close()
    for _, held in running:
        held.close()
    assert not allowance.running


@pytest.mark.parametrize(
    ("per_address", "line"),
    [(1, "1 answer is running from your address"), (3, "3 answers are running from your address")],
)
def test_the_addresss_refusal_says_how_many_in_plain_words(per_address: int, line: str):
    allowance = Allowance(per_visitor=10, per_address=per_address)
    with contextlib.ExitStack() as held:
        for number in range(per_address):
            held.enter_context(allowance.held(Visit(counted_as=f"v{number}", address="192.0.2.1")))
        with pytest.raises(ConversationError, match=line):
            held.enter_context(allowance.held(Visit(counted_as="another", address="192.0.2.1")))
