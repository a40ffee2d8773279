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
