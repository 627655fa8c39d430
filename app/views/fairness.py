"""How many answers one visitor may have running at once, so that one client cannot hold every
slot of the server's queue while others wait (a hostile review: 80 open `/chat` calls from one
script left every other visitor's events refused with "Queue is full").

A visitor is who the server's cookie says (`app.views.identity`): a page, or a script that keeps
the cookie it was given (`gradio_client` does). Clients that keep no cookie are a new visitor at
every request, so they share one allowance between them: a script that drops its cookie competes
with other such scripts, not with the visitors of the page. Past the allowance a send is refused
at once, in one line, and its slot in the queue is free again.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager

from app.domain.conversation import ConversationError
from app.domain.sessions import Visit

# Whom the answers of every client that kept no cookie count against (`Visit.counted_as`).
NO_COOKIE = ""


class Allowance:
    """Answers running per visitor (`per_visitor` each; clients without a cookie share one such
    allowance). The page's event loop is its only user: no lock."""

    def __init__(self, per_visitor: int) -> None:
        self.per_visitor = per_visitor
        self.running: Counter[str] = Counter()

    @contextmanager
    def held(self, visit: Visit) -> Iterator[None]:
        """One of `visit`'s answers while it runs; refuses (`ConversationError`) past the allowance."""
        key = visit.counted_as
        if self.running[key] >= self.per_visitor:
            if key == NO_COOKIE:
                raise ConversationError(
                    f"{self.per_visitor} answers are running for clients that keep no cookie, the most at "
                    "once: keep the cookie this server sets (gradio_client does), or try again shortly."
                )
            answers = "answer" if self.per_visitor == 1 else "answers"
            raise ConversationError(
                f"You have {self.per_visitor} {answers} running, the most at once: wait for one to end, "
                "or stop one."
            )
        self.running[key] += 1
        try:
            yield
        finally:
            self.running[key] -= 1
            if not self.running[key]:
                del self.running[key]
