"""Lines per second of ``iter_log_lines`` over a 1,000,000-line log (about 60 bytes a line).

Standalone: ``python bench/log_throughput.py [--lines N]``. The file is
generated in a temporary directory, so the numbers measure reading, cutting,
decoding, filtering and yielding, with the page cache warm.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import anyio

from supervisor.logs import Stream, iter_log_lines


def _generate(directory: Path, count: int) -> int:
    with open(directory / "combined.log", "wb") as out:
        for start in range(0, count, 10_000):
            out.write(
                "".join(
                    f"2024-05-01T12:00:{i % 60:02d} INFO worker-{i % 7} handled request {i:08d}\n"
                    for i in range(start, min(count, start + 10_000))
                ).encode()
            )
    return (directory / "combined.log").stat().st_size


async def _count(directory: Path, regex: str | None) -> tuple[int, float]:
    started = time.perf_counter()
    seen = 0
    async for _ in iter_log_lines(directory, stream=Stream.COMBINED, regex=regex):
        seen += 1
    return seen, time.perf_counter() - started


async def _main(count: int, rounds: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        size = _generate(directory, count)
        print(f"{count:,} lines, {size / count:.1f} bytes per line")
        cases = (
            ("plain", None),
            ("regex 'request 0+12'", r"request 0+12"),
            ("regex 'INFO' (all)", "INFO"),
        )
        for label, regex in cases:
            runs = [await _count(directory, regex) for _ in range(rounds)]
            seen, seconds = min(runs, key=lambda run: run[1])
            rate = count / seconds
            print(f"{label:>22}: {rate:>12,.0f} lines/s ({seen:,} yielded, {seconds:.3f} s)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--lines", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    anyio.run(_main, args.lines, args.rounds)


if __name__ == "__main__":
    main()
