"""What the chat's Stop check (`app.domain.replies.until_stopped`) costs on the streaming path,
and how soon it takes: the same answers read by a plain loop and through it, side by side.

    .venv/bin/python bench/bench_stop_check.py [--pieces 20000] [--streams 50] [--rounds 5]

An answer's pieces come from a queue the engine fills, as vLLM's output collector hands them on:
each read awaits the queue, and most pieces are already there. No engine runs: the check's own
cost is what is measured. Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from app.domain.replies import STOP_CHECK_S, until_stopped

Reader = Callable[[AsyncIterator[int]], AsyncIterator[int]]


async def queued(pieces: int) -> AsyncIterator[int]:
    """An answer of `pieces` pieces, each awaited from a queue (filled here beforehand)."""
    queue: asyncio.Queue[int] = asyncio.Queue()
    for piece in range(pieces):
        queue.put_nowait(piece)
    for _ in range(pieces):
        yield await queue.get()


async def plain(stream: AsyncIterator[int]) -> AsyncIterator[int]:
    async for piece in stream:
        yield piece


async def checked(stream: AsyncIterator[int]) -> AsyncIterator[int]:
    async for piece in until_stopped(stream, lambda: False):
        yield piece


async def read_all(reader: Reader, streams: int, pieces: int) -> float:
    """Seconds to read `streams` answers of `pieces` pieces each, all at once on one loop."""

    async def one() -> None:
        async for _ in reader(queued(pieces)):
            await asyncio.sleep(0)  # the handler hands each piece on, letting the others run

    started = time.perf_counter()
    await asyncio.gather(*(one() for _ in range(streams)))
    return time.perf_counter() - started


async def stop_delay(stall_s: float, every_s: float) -> float:
    """Seconds from Stop to the reader's end, for an answer that stalls (hands on nothing)."""
    stopped = False

    async def stalled() -> AsyncIterator[int]:
        yield 0
        await asyncio.Event().wait()  # a long prefill, a busy engine
        yield 1

    async def press() -> float:
        nonlocal stopped
        await asyncio.sleep(stall_s)
        stopped = True
        return time.perf_counter()

    pressed = asyncio.create_task(press())
    async for _ in until_stopped(stalled(), lambda: stopped, every_s):
        pass
    return time.perf_counter() - await pressed


async def main(pieces: int, streams: int, rounds: int) -> None:
    each = pieces // streams
    one = {"plain loop": [], "until_stopped": []}
    many = {"plain loop": [], "until_stopped": []}
    for _ in range(rounds):  # alternated, so that both see the same machine
        for name, reader in (("plain loop", plain), ("until_stopped", checked)):
            one[name].append(await read_all(reader, 1, pieces) / pieces * 1e6)
            many[name].append(await read_all(reader, streams, each) / (streams * each) * 1e6)
    delays = [await stop_delay(0.05 + 0.037 * i, STOP_CHECK_S) for i in range(20)]
    base_one, base_many = statistics.median(one["plain loop"]), statistics.median(many["plain loop"])
    print(f"| reader | one answer of {pieces:,} pieces, µs a piece | {streams} answers at once, µs a piece |")
    print("| --- | --- | --- |")
    for name in one:
        a, b = statistics.median(one[name]), statistics.median(many[name])
        print(f"| {name} | {a:.1f} ({a / base_one:.1f}x) | {b:.1f} ({b / base_many:.1f}x) |")
    extra = statistics.median(many["until_stopped"]) - base_many
    print(
        f"\nThe check's cost at {streams} visitors of 50 tokens a second: "
        f"{extra * streams * 50 / 1e4:.1f}% of one core."
    )
    print(
        f"Stop pressed while the answer stalls, to the reader's end ({len(delays)} presses, "
        f"checked every {STOP_CHECK_S} s): median {statistics.median(delays) * 1000:.0f} ms, "
        f"worst {max(delays) * 1000:.0f} ms."
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pieces", type=int, default=20_000)
    parser.add_argument("--streams", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=5)
    arguments = parser.parse_args()
    asyncio.run(main(arguments.pieces, arguments.streams, arguments.rounds))
