"""How many answers one client may have running at once, so that no client holds every slot of
the server's queue while others wait (a hostile review: 80 open `/chat` calls from one script
left every other visitor's events refused with "Queue is full").

Two allowances, both checked: one per visitor (the server's cookie, or a tab where the browser
keeps none), so that one browser cannot take what an office behind one address shares; and one
per client address, since a cookie costs a script nothing (a fresh one at every call). The
address is the connection's peer, or behind a trusted proxy the client it forwarded for
(`app.views.identity`; on a Space, Hugging Face's proxy is trusted by default). Past either, a
send is refused at once, in one line, and its slot in the queue is free again: the allowance
per address must stay below the queue's answers per view (`APP_CONCURRENCY`) for that.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager

from app.domain.conversation import ConversationError
from app.domain.sessions import Visit


class Allowance:
    """Answers running per visitor and per address. The page's event loop is its only user: no
    lock."""

    def __init__(self, per_visitor: int, per_address: int) -> None:
        self.per_visitor = per_visitor
        self.per_address = per_address
        self.running: Counter[str] = Counter()

    @contextmanager
    def held(self, visit: Visit) -> Iterator[None]:
        """One of `visit`'s answers while it runs; refuses (`ConversationError`) past an allowance."""
        keys = [f"visitor {visit.counted_as}", f"address {visit.address}"]
        if self.running[keys[0]] >= self.per_visitor:
            raise ConversationError(
                f"You have {plural(self.per_visitor)} running, the most at once: wait for one to end, "
                "or stop one."
            )
        if self.running[keys[1]] >= self.per_address:
            raise ConversationError(
                f"{plural(self.per_address)} {'is' if self.per_address == 1 else 'are'} running from your "
                "address, the most at once: wait for one to end, or try again shortly."
            )
        self.running.update(keys)
        try:
            yield
        finally:
            self.running.subtract(keys)
            for key in keys:
                if not self.running[key]:
                    del self.running[key]


def plural(count: int) -> str:
    return f"{count} answer" if count == 1 else f"{count} answers"
