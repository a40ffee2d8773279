"""``Supervisor.attach`` of a Slurm app whose owner was SIGKILLed, on the real cluster.

The process that attaches follows the job as its owner from then on: the
replica's failure and its retry (the batch script's requeue) are seen live,
the app ends as its machines decide, and ``watch`` gives every transition,
the dead owner's and its own, exactly once.
"""

from __future__ import annotations

import json
import os
import sys
from functools import partial
from pathlib import Path

import anyio
import pytest

from supervisor import AppState, Supervisor
from supervisor.backends.slurm import SlurmBackend
from supervisor.backends.slurm.poller import PollerSettings
from supervisor.status import Transition

from .slurm_cluster import ensure_cluster

pytestmark = [pytest.mark.anyio, pytest.mark.integration, pytest.mark.slurm]

ROOT = Path(__file__).resolve().parents[2]

# Attempt 0 fails once GATE/fail exists; attempt 1 (the retry) succeeds.
REPLICA = (
    'echo attempt "$ASUPERVISOR_ATTEMPT"; '
    'if [ "$ASUPERVISOR_ATTEMPT" = 0 ]; then '
    'while [ ! -e "$1/fail" ]; do sleep 0.1; done; echo failing; exit 3; fi; '
    "echo done"
)

OWNER = """
import sys, anyio
from supervisor import AppDef, Role, Supervisor

async def main() -> None:
    gate, code = sys.argv[1:3]
    role = Role("w", entrypoint="sh", args=["-c", code, "sh", gate], max_retries=1)
    async with Supervisor(session="attach-owner") as sv:
        handle = await sv.submit(AppDef("adopted", [role]), "slurm")
        async for _ in sv.log_iter(handle, "w", 0, should_tail=True):
            break  # the first line is in the files: the job runs
        print(handle, flush=True)
        await anyio.sleep_forever()

anyio.run(main)
"""


@pytest.fixture(scope="module")
def cluster() -> dict[str, object]:
    return ensure_cluster(accounting=True)


def _key(t: Transition) -> tuple[object, ...]:
    return (t.seq, t.source, t.dest, t.trigger, t.role, t.replica_id, t.attempt)


async def _submitted_by_an_owner_then_killed(gate: Path, replica: str) -> str:
    """The handle of an app OWNER submitted, once its job runs; the owner is then SIGKILLed
    (no close, no release, no final record)."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }
    argv = [sys.executable, "-c", OWNER, str(gate), replica]
    async with await anyio.open_process(argv, env=env) as owner:
        assert owner.stdout is not None
        with anyio.fail_after(120):
            handle = (await owner.stdout.receive()).decode().strip()
        owner.kill()
        await owner.wait()
    assert handle.startswith("slurm://"), handle
    return handle


@pytest.mark.timeout(300)
async def test_a_slurm_app_whose_owner_was_sigkilled_is_followed_by_the_process_that_attaches(
    cluster: dict[str, object], state_dir: Path, tmp_path: Path
) -> None:
    handle = await _submitted_by_an_owner_then_killed(tmp_path, REPLICA)

    fast = partial(SlurmBackend, poller=PollerSettings(fast=0.5, slow=1.0))
    async with Supervisor(session="attach-new", backends={"slurm": fast}) as sv:
        attached = await sv.attach(handle)
        # As its owner last recorded it: the first look of this process's poller comes next.
        assert attached.state in (AppState.PENDING, AppState.RUNNING), attached
        assert handle in sv.followed()
        [app_json] = [p async for p in anyio.Path(state_dir).glob("**/adopted-*/app.json")]
        assert json.loads(await app_json.read_text())["owner"]["pid"] == os.getpid()

        seen: list[Transition] = []

        async def watch() -> None:
            async for t in sv.watch(handle):
                seen.append(t)

        async with anyio.create_task_group() as tg:
            tg.start_soon(watch)
            (tmp_path / "fail").touch()
            with anyio.fail_after(180):
                final = await sv.wait(handle)
        assert final.state is AppState.SUCCEEDED, final
        assert final.num_restarts == 1 and final.roles[0].replicas[0].restarts == 1, final
        assert [t.seq for t in seen] == list(range(len(seen)))  # each once, in order
        assert (seen[-1].role, seen[-1].dest) == (None, "SUCCEEDED"), seen
        lines = [line async for line in sv.log_iter(handle, "w", 0, streams="stdout")]
        assert lines == ["attempt 0\n", "failing\n", "attempt 1\n", "done\n"], lines

    async with Supervisor(session="attach-later") as later:
        described = await later.describe(handle)
        assert described is not None and described.state is AppState.SUCCEEDED, described
        assert [_key(t) for t in described.transitions] == [_key(t) for t in seen]


# Attempt 0 fails once GATE/fail exists; attempt 1 runs until GATE/finish exists.
REPLICA_HELD_AFTER_RETRY = (
    'echo attempt "$ASUPERVISOR_ATTEMPT"; '
    'if [ "$ASUPERVISOR_ATTEMPT" = 0 ]; then '
    'while [ ! -e "$1/fail" ]; do sleep 0.1; done; echo failing; exit 3; fi; '
    'while [ ! -e "$1/finish" ]; do sleep 0.1; done; echo done'
)


@pytest.mark.timeout(300)
async def test_attach_answers_what_slurm_says_now_not_what_the_dead_owner_recorded(
    cluster: dict[str, object], state_dir: Path, tmp_path: Path
) -> None:
    """The owner is SIGKILLed, then the batch script retries the failed run by itself:
    the records still say attempt 0. Before, ``attach`` answered that (0 restarts) while
    ``describe`` said 1; it answers after its first look at the job now."""
    handle = await _submitted_by_an_owner_then_killed(tmp_path, REPLICA_HELD_AFTER_RETRY)
    (tmp_path / "fail").touch()
    async with Supervisor(session="reader") as reader:
        with anyio.fail_after(120):
            while True:  # the script's own retry, as Slurm shows it
                described = await reader.describe(handle)
                assert described is not None
                if described.state is AppState.RUNNING and described.num_restarts == 1:
                    break
                await anyio.sleep(0.2)
    fast = partial(SlurmBackend, poller=PollerSettings(fast=0.5, slow=1.0))
    async with Supervisor(session="attach-new", backends={"slurm": fast}) as sv:
        attached = await sv.attach(handle)
        assert (attached.state, attached.num_restarts) == (AppState.RUNNING, 1), attached
        (tmp_path / "finish").touch()
        with anyio.fail_after(120):
            final = await sv.wait(handle)
        assert final.state is AppState.SUCCEEDED and final.num_restarts == 1, final
