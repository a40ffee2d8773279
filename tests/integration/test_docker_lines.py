"""Every line of a replica's output copied once and in order, on a machine whose CPU is busy.

Under CPU load Podman's follow stream loses and reorders pieces of a container's
output (one replica in four read 19,996 of 20,000 lines; two lines came glued).
The backend checks what it copied against the engine's whole log at the exit and
rewrites the attempt's files from it when they differ. Both engines, so dockerd
(whose follow stream stays whole) is held to the same bar.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from supervisor import AppDef, AppState, Role, Supervisor

from .docker_engines import IMAGE, EngineUnderTest

pytestmark = [pytest.mark.anyio, pytest.mark.integration, pytest.mark.docker]

LINES = 20000
BUSY_LOOPS = 4
WRITER = "import sys\nfor i in range(int(sys.argv[1])):\n    print(f'line {i}')\n"


@pytest.fixture
def busy_cpu() -> Iterator[None]:
    """Processes of this test that spin on the CPU until it ends."""
    loops = [
        subprocess.Popen(
            [sys.executable, "-c", "while True: pass"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            start_new_session=True,
        )
        for _ in range(BUSY_LOOPS)
    ]
    try:
        yield
    finally:
        for loop in loops:
            os.kill(loop.pid, signal.SIGKILL)
            loop.wait()


@pytest.mark.usefixtures("busy_cpu")
async def test_every_line_is_copied_once_in_order_with_the_cpu_saturated(
    engine: EngineUnderTest,
) -> None:
    role = Role(
        "w", image=IMAGE, entrypoint="python3", args=["-c", WRITER, str(LINES)], num_replicas=2
    )
    expected = [f"line {i}\n" for i in range(LINES)]
    with anyio.fail_after(540):
        async with Supervisor(session=engine.session) as sv:
            handles = [
                await sv.submit(AppDef(f"lines{n}", [role]), "docker", engine.cfg) for n in range(2)
            ]
            for handle in handles:
                status = await sv.wait(handle, timeout=300)
                assert status.state is AppState.SUCCEEDED, status
            for handle in handles:
                for k in range(2):
                    for stream in ("stdout", "combined"):
                        got = [line async for line in sv.log_iter(handle, "w", k, streams=stream)]
                        first = next(
                            (
                                i
                                for i, (a, b) in enumerate(zip(got, expected, strict=False))
                                if a != b
                            ),
                            min(len(got), len(expected)),
                        )
                        assert got == expected, (
                            handle,
                            k,
                            stream,
                            len(got),
                            first,
                            got[first : first + 2],
                        )


RELEASED = (
    "import os, sys, time\n"
    "for i in range(2000): print(f'line {i}')\n"
    "sys.stdout.flush()\n"
    "while not os.path.exists('/asupervisor/replica/go'): time.sleep(0.1)\n"
    "for i in range(2000, 3000): print(f'line {i}')\n"
)


async def test_a_copy_found_wrong_by_the_process_that_finishes_the_app_is_rewritten(
    engine: EngineUnderTest, tmp_path: Path
) -> None:
    """The launching process copied part of the output and left (its Supervisor closed);
    another process finishes the app: it checks the files against the engine's log rather
    than trusting their length, and writes the attempt again when they differ (here a
    line went missing from the files while nobody followed)."""
    role = Role("w", image=IMAGE, entrypoint="python3", args=["-c", RELEASED])
    expected = [f"line {i}\n" for i in range(3000)]
    with anyio.fail_after(300):
        async with Supervisor(session=engine.session) as owner:
            cfg = {**engine.cfg, "log_dir": str(tmp_path / "logs")}
            handle = await owner.submit(AppDef("released", [role]), "docker", cfg)
            async for line in owner.log_iter(handle, "w", 0, should_tail=True):
                if line == "line 1999\n":
                    break
        async with Supervisor(session=engine.session) as other:
            (stdout_log,) = (tmp_path / "logs").glob("**/w/0/stdout.log")
            replica_dir = stdout_log.parent
            damaged = stdout_log.read_bytes().replace(b"line 1000\n", b"", 1)
            assert damaged != stdout_log.read_bytes()
            stdout_log.write_bytes(damaged)
            (replica_dir / "go").touch()
            status = await other.wait(handle, timeout=120)
            assert status.state is AppState.SUCCEEDED, status
            for stream in ("stdout", "combined"):
                got = [line async for line in other.log_iter(handle, "w", 0, streams=stream)]
                assert got == expected, (stream, len(got))
