"""No replica outlives its supervisor, however the supervisor ends.

Each case runs a real supervising Python process that launches replicas of
``sleep 600`` and reports their pids; the test then ends that process and
checks, with pidfds, that every replica is gone within 2 seconds.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import anyio
import pytest

from supervisor import AppDef, AppState, AppStatus, ReplicaState, Role, Supervisor

from .helpers import pid_gone_within, until

pytestmark = [pytest.mark.integration]

EMBEDDER = textwrap.dedent(
    """
    import asyncio, os, signal, sys
    from supervisor import AppDef, Role, Supervisor

    MODE = sys.argv[1]

    async def main() -> None:
        if MODE == "handles-sigterm":
            # The embedding service's own handler: cancel the main task.
            task = asyncio.current_task()
            asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
        role = Role(name="s", entrypoint="sh", args=["-c", "echo $$$$; exec sleep 600"],
                    num_replicas=2)
        async with Supervisor(session="orphans") as sv:
            handle = await sv.submit(AppDef(name="o", roles=[role]), "local")
            pids = []
            for k in range(2):
                async for line in sv.log_iter(handle, "s", k, should_tail=True):
                    pids.append(line.strip())
                    break
            print("PIDS", handle, *pids, flush=True)
            await sv.wait(handle)

    try:
        asyncio.run(main())
    except KeyboardInterrupt:
        sys.exit(130)
    """
)


def _start_embedder(tmp_path: Path, mode: str) -> tuple[subprocess.Popen[str], str, list[int]]:
    script = tmp_path / "embedder.py"
    script.write_text(EMBEDDER)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    proc = subprocess.Popen(
        [sys.executable, str(script), mode], stdout=subprocess.PIPE, text=True, env=env
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()  # the embedder prints its replicas' pids, then waits
    assert line.startswith("PIDS "), line
    handle, *pids = line.split()[1:]
    assert len(pids) == 2
    return proc, handle, [int(p) for p in pids]


@pytest.mark.parametrize(
    ("mode", "sig"),
    [
        ("plain", signal.SIGKILL),
        ("handles-sigterm", signal.SIGTERM),
        ("plain", signal.SIGINT),
        ("plain", signal.SIGTERM),
    ],
)
def test_no_replica_survives_the_supervisor(
    state_dir: Path, tmp_path: Path, mode: str, sig: signal.Signals
) -> None:
    proc, handle, pids = _start_embedder(tmp_path, mode)
    try:
        proc.send_signal(sig)
        proc.wait(timeout=30)
        for pid in pids:
            assert pid_gone_within(pid, 2.0), f"replica {pid} outlived its supervisor ({sig.name})"
        final = anyio.run(_wait_elsewhere, handle)
        if sig is signal.SIGKILL or (sig is signal.SIGTERM and mode == "plain"):
            # Killed with no chance to record an end: others are told so, not left waiting.
            assert final.state is AppState.UNKNOWN
            assert "ended without recording a final state" in final.msg
        else:
            assert final.state is AppState.CANCELLED
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


async def _wait_elsewhere(handle: str) -> AppStatus:
    async with Supervisor(session="observer") as sv:
        with anyio.fail_after(10):
            return await sv.wait(handle)


@pytest.mark.anyio
async def test_library_installs_no_signal_handlers(state_dir: Path) -> None:
    watched = (signal.SIGINT, signal.SIGTERM, signal.SIGCHLD, signal.SIGHUP)
    before = {s: signal.getsignal(s) for s in watched}
    async with Supervisor(session="svc") as sv:
        handle = await sv.submit(
            AppDef(name="t", roles=[Role(name="a", entrypoint="true")]), "local"
        )
        await sv.wait(handle, timeout=30)
        assert {s: signal.getsignal(s) for s in watched} == before
    assert {s: signal.getsignal(s) for s in watched} == before


@pytest.mark.anyio
async def test_a_replica_ends_with_its_main_process_and_takes_its_group_along(
    state_dir: Path,
) -> None:
    """What runs on in a replica's process group when its main process exits (a
    ``cmd &`` it did not wait for) is killed then, while the app still runs: a replica
    is its group, as a container is its processes (docs/backends/local.md)."""
    left = Role(name="left", entrypoint="sh", args=["-c", "sleep 600 & echo $!; exit 0"])
    stays = Role(name="stays", entrypoint="sh", args=["-c", "echo up; exec sleep 600"])
    async with Supervisor(session="svc") as sv:
        handle = await sv.submit(AppDef(name="g", roles=[left, stays]), "local")
        async for line in sv.log_iter(handle, "left", 0, should_tail=True):
            background = int(line)
            break
        assert pid_gone_within(background, 5), "the replica's background sleep runs on"

        def left_ended() -> bool:
            status = sv.status(handle)
            replica = None if status is None else status.replica("left", 0)
            return replica is not None and replica.state is ReplicaState.SUCCEEDED

        await until(left_ended, 10)
        status = sv.status(handle)
        assert status is not None and status.state is AppState.RUNNING  # "stays" runs on
        await sv.cancel(handle)
