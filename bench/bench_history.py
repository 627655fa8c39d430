"""The history database under load, on SQLite and on PostgreSQL: insert rates for votes and
conversations, the leaderboard's time over 100,000 votes, and whether storing holds up an
answer that streams meanwhile.

    .venv/bin/python bench/bench_history.py [--votes 100000] [--conversations 10000]

PostgreSQL is Debian's package (`scripts/setup-cpu-env.sh` installs it), started privately on
loopback as the tests do (`tests/postgres.py`). Prints a Markdown table per database.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from postgres import postgres_server  # noqa: E402

from app.domain.leaderboard import leaderboard  # noqa: E402
from app.storage.history import (  # noqa: E402
    ConversationRecord,
    History,
    ReplyRecord,
    TurnRecord,
    VoteRecord,
    new_id,
    sqlite_url,
)
from app.storage.votes import OUTCOMES  # noqa: E402

MODELS = [f"model-{i}" for i in range(12)]
MODALITIES = ("text", "image", "images", "video")


def votes(count: int, rng: random.Random) -> list[VoteRecord]:
    battle = new_id()
    made = []
    for _ in range(count):
        a, b = rng.sample(MODELS, 2)
        made.append(
            VoteRecord(
                battle_id=battle,
                browser_id="bench",
                model_a=a,
                model_b=b,
                outcome=rng.choice(OUTCOMES),
                modality=rng.choice(MODALITIES),
                prompt_tokens=rng.randint(20, 4000),
            )
        )
    return made


def conversation(rng: random.Random) -> ConversationRecord:
    turns = [
        TurnRecord(
            text=f"Question {i}: " + "words " * rng.randint(3, 30),
            replies=[
                ReplyRecord(model=rng.choice(MODELS), answer="answer " * rng.randint(10, 200), ttft_s=0.3)
            ],
        )
        for i in range(3)
    ]
    return ConversationRecord(id=new_id(), model=rng.choice(MODELS), turns=turns)


async def streaming_lag(history: History, records: list[ConversationRecord]) -> tuple[float, float]:
    """Saves `records` in a worker thread, as the app does, while a stand-in for a stream ticks
    every 10 ms on the event loop: the ticker's worst lateness, and the saving time."""
    lateness = 0.0
    saving = True

    async def ticker() -> None:
        nonlocal lateness
        while saving:
            due = time.perf_counter() + 0.01
            await asyncio.sleep(0.01)
            lateness = max(lateness, time.perf_counter() - due)

    tick = asyncio.create_task(ticker())
    started = time.perf_counter()
    for record in records:
        await asyncio.to_thread(history.save, "bench-stream", record)
    elapsed = time.perf_counter() - started
    saving = False
    await tick
    return lateness, elapsed


def measure(name: str, url: str, vote_count: int, conversation_count: int) -> None:
    rng = random.Random(1)  # noqa: S311 (made-up data, seeded to be reproducible)
    history = History(url, Path(tempfile.mkdtemp(prefix="bench-media-")))
    made = votes(vote_count, rng)
    started = time.perf_counter()
    for start in range(0, len(made), 1000):  # the arena stores a vote at a time; batches here
        history.add_votes(made[start : start + 1000])
    vote_s = time.perf_counter() - started
    # As the arena stores them: one vote per transaction.
    single = votes(1000, rng)
    started = time.perf_counter()
    for vote in single:
        history.add_votes([vote])
    single_s = time.perf_counter() - started
    records = [conversation(rng) for _ in range(conversation_count)]
    started = time.perf_counter()
    for record in records:
        history.save(f"browser-{rng.randint(0, 999)}", record)
    conversation_s = time.perf_counter() - started
    started = time.perf_counter()
    stored = history.votes()
    read_s = time.perf_counter() - started
    started = time.perf_counter()
    rows = leaderboard(stored, rounds=1000)
    board_s = time.perf_counter() - started
    lateness, _ = asyncio.run(streaming_lag(history, [conversation(rng) for _ in range(200)]))
    history.close()
    print(f"\n### {name}\n")
    print("| measure | result |\n| --- | --- |")
    vote_rate = f"{vote_s:.1f} s, {vote_count / vote_s:,.0f} votes/s"
    print(f"| {vote_count:,} votes written (batches of 1,000) | {vote_rate} |")
    print(f"| 1,000 more votes, one per transaction (as the arena writes) | {1000 / single_s:,.0f} votes/s |")
    print(
        f"| {conversation_count:,} conversations of 3 turns saved one by one | {conversation_s:.1f} s, "
        f"{conversation_count / conversation_s:,.0f} conversations/s |"
    )
    print(f"| the {len(stored):,} votes read back | {read_s:.2f} s |")
    print(f"| leaderboard, 1,000 bootstrap rounds over them ({len(rows)} models) | {board_s:.2f} s |")
    print(f"| the leaderboard tab's whole refresh (read + scores) | {read_s + board_s:.2f} s |")
    print(f"| a 10 ms ticker's worst lateness while 200 conversations are saved | {lateness * 1000:.1f} ms |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--votes", type=int, default=100_000)
    parser.add_argument("--conversations", type=int, default=10_000)
    args = parser.parse_args()
    measure(
        "SQLite (WAL)",
        sqlite_url(Path(tempfile.mkdtemp(prefix="bench-sqlite-"))),
        args.votes,
        args.conversations,
    )
    with postgres_server() as url:
        measure("PostgreSQL 15 (loopback)", url, args.votes, args.conversations)


if __name__ == "__main__":
    main()
