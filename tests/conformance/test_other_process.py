"""Apps seen by whoever did not start them: unknown handles, a second Supervisor, the CLI,
and what closing the first Supervisor does to its apps (durable or not, as declared)."""

from __future__ import annotations

import os
from pathlib import Path

import anyio
import pytest

from supervisor import AppState, ReplicaState, Supervisor, Transition, UnknownAppError
from supervisor.backends.base import CANCELLED_ELSEWHERE
from supervisor.backends.store import Index
from supervisor.specs import parse_handle

from ..integration.helpers import until
from .helpers import TRAPS_TERM, WAIT_FOR, app, cli, cli_json, first_line, lines
from .target import Target

pytestmark = [pytest.mark.anyio, pytest.mark.integration]

LIVE = (AppState.PENDING, AppState.RUNNING)


def _state(sv: Supervisor, handle: str) -> AppState:
    """The app's state in ``sv.status``; a snapshot lost on the way fails the test."""
    status = sv.status(handle)
    assert status is not None, f"{handle} is not followed by this Supervisor"
    return status.state


async def test_an_unknown_handle_is_an_unknown_app_everywhere(
    target: Target, sv: Supervisor
) -> None:
    handle = f"{target.backend}://conf/never-00000000"
    assert sv.status(handle) is None
    assert await sv.describe(handle) is None  # None, not an error: the TorchX contract
    assert not await sv.exists(handle)
    with pytest.raises(UnknownAppError):
        await sv.wait(handle, timeout=target.timeout)
    with pytest.raises(UnknownAppError):
        await sv.cancel(handle)
    with pytest.raises(UnknownAppError):
        await lines(sv, handle, "r", 0)
    with pytest.raises(UnknownAppError):
        await lines(sv, handle, "r", 0, should_tail=True)
    code, _, err = await cli(target, "status", "--json", handle)
    assert code == 1 and handle in err, err
    code, _, err = await cli(target, "cancel", handle)
    assert code == 1 and handle in err, err
    code, _, err = await cli(target, "log", handle)
    assert code == 1 and handle in err, err


async def test_a_second_supervisor_describes_lists_follows_and_cancels(
    target: Target, sv: Supervisor, cfg: dict[str, object], exchange: Path
) -> None:
    handle = await sv.submit(
        app(target.role("r", TRAPS_TERM, exchange=exchange, num_replicas=2)), target.backend, cfg
    )
    async with target.supervisor("observer") as other:
        with anyio.fail_after(target.timeout):
            assert await first_line(other, handle, "r", 0) == "ready\n"
            assert await first_line(other, handle, "r", 1) == "ready\n"
        assert other.status(handle) is None  # not followed there: no snapshot, records instead
        described = await other.describe(handle)
        assert described is not None and described.state in LIVE, described
        assert [r.name for r in described.roles] == ["r"]
        listed = {a.app_handle: a for a in await other.list(target.backend)}
        assert handle in listed and listed[handle].name == "conf", listed
        await other.cancel(handle)
        await other.cancel(handle)  # idempotent from there too
        with anyio.fail_after(target.timeout):
            mine = await sv.wait(handle)
            theirs = await other.wait(handle)
        assert mine.state is AppState.CANCELLED, mine
        assert theirs.state is AppState.CANCELLED, theirs
        # The owner tells the other Supervisor's cancel in one wording on every backend,
        # not as a cancel from the scheduler's side (Slurm said "job N was cancelled in
        # Slurm").
        assert mine.msg == CANCELLED_ELSEWHERE, mine
        replica = theirs.replica("r", 0)
        assert replica is not None and replica.state is ReplicaState.CANCELLED, theirs
        assert await lines(other, handle, "r", 0, streams="stdout") == ["ready\n", "got TERM\n"]
        with anyio.fail_after(10):  # following an ended app from there stops by itself
            followed = [x async for x in other.log_iter(handle, "r", 1, should_tail=True)]
        assert followed == await lines(sv, handle, "r", 1)


async def test_a_supervisor_that_attaches_while_the_owner_lives_keeps_its_status_current(
    target: Target, sv: Supervisor, cfg: dict[str, object], exchange: Path
) -> None:
    """``attach`` while the owner lives observes: from then on ``status`` (no I/O) answers
    the app from its records as they change, to its end, and keeps the final status;
    the observer carries out nothing (the owner alone cancels the replica)."""
    handle = await sv.submit(
        app(target.role("r", TRAPS_TERM, exchange=exchange)), target.backend, cfg
    )
    async with target.supervisor("observer") as other:
        with anyio.fail_after(target.timeout):
            assert await first_line(other, handle, "r", 0) == "ready\n"
        assert other.status(handle) is None  # not followed yet
        seen = await other.attach(handle)
        assert seen.state in LIVE, seen
        assert other.followed() == []  # observed, not owned
        await until(lambda: _state(other, handle) is AppState.RUNNING, target.timeout)
        assert (await other.attach(handle)).state is AppState.RUNNING  # again: still observed
        await sv.cancel(handle)
        with anyio.fail_after(target.timeout):
            mine = await sv.wait(handle)
        assert mine.state is AppState.CANCELLED, mine
        await until(lambda: _state(other, handle) is AppState.CANCELLED, target.timeout)
        now = other.status(handle)
        assert now is not None
        replica = now.replica("r", 0)
        assert replica is not None and replica.state is ReplicaState.CANCELLED, now
        assert await lines(other, handle, "r", 0, streams="stdout") == ["ready\n", "got TERM\n"]
    final = other.status(handle)  # closed: the cache of ended apps still answers it
    assert final is not None and final.state is AppState.CANCELLED, final


async def test_a_second_supervisor_watches_each_transition_as_recorded_and_once(
    target: Target, sv: Supervisor, cfg: dict[str, object], exchange: Path
) -> None:
    """``watch`` of an app another Supervisor follows: what was recorded, then each
    transition as it is recorded (the app's RUNNING arrives while it runs), none twice,
    to the app's end; the same list its records hold."""
    handle = await sv.submit(
        app(target.role("r", TRAPS_TERM, exchange=exchange, num_replicas=2)), target.backend, cfg
    )
    seen: list[Transition] = []
    running = anyio.Event()
    async with target.supervisor("observer") as other:

        async def watch() -> None:
            async for t in other.watch(handle):
                seen.append(t)
                if t.role is None and t.dest == "RUNNING":
                    running.set()

        with anyio.fail_after(target.timeout):
            async with anyio.create_task_group() as tg:
                tg.start_soon(watch)
                await running.wait()  # live: the app still runs, nothing cancelled it yet
                await sv.cancel(handle)
            described = await other.describe(handle)
    assert described is not None and described.state is AppState.CANCELLED, described
    assert seen == list(described.transitions)
    assert [t.seq for t in seen] == sorted({t.seq for t in seen})
    assert (seen[-1].role, seen[-1].dest) == (None, "CANCELLED"), seen[-1]


async def test_the_cli_in_another_process_reads_and_cancels_an_app(
    target: Target, sv: Supervisor, cfg: dict[str, object], exchange: Path
) -> None:
    handle = await sv.submit(
        app(target.role("r", TRAPS_TERM, exchange=exchange)), target.backend, cfg
    )
    with anyio.fail_after(target.timeout):
        assert await first_line(sv, handle, "r", 0) == "ready\n"
    status = await cli_json(target, "status", handle)
    assert status["handle"] == handle and status["state"] in ("PENDING", "RUNNING"), status
    listed = await cli_json(target, "list", "--backend", target.backend)
    assert [(a["handle"], a["name"]) for a in listed] == [(handle, "conf")], listed
    code, out, err = await cli(target, "log", handle, "r/0", "--streams", "stdout")
    assert code == 0 and out == "ready\n", (code, out, err)
    code, out, err = await cli(target, "log", handle, "--regex", "^nothing$")
    assert code == 0 and out == "", (code, out, err)
    code, _, err = await cli(target, "cancel", handle)
    assert code == 0, err
    final = await sv.wait(handle, timeout=target.timeout)
    assert final.state is AppState.CANCELLED, final
    ended = await cli_json(target, "status", handle, code=3)
    assert ended["state"] == "CANCELLED", ended
    code, out, err = await cli(target, "log", handle, "r/0", "--streams", "stdout")
    assert code == 0 and out == "ready\ngot TERM\n", (code, out, err)
    code, _, err = await cli(target, "cancel", handle)  # an ended app: fine, says so
    assert code == 0 and "CANCELLED" in err, err


async def test_closing_the_supervisor_keeps_durable_apps_and_stops_the_others(
    target: Target, state_dir: Path, cfg: dict[str, object], exchange: Path
) -> None:
    script = WAIT_FOR + 'echo started; touch "$CONF_DIR/started"; wait_for go; echo finished'
    async with target.supervisor("first") as first:
        durable = type(first.backend(target.backend)).durable
        handle = await first.submit(
            app(target.role("r", script, exchange=exchange)), target.backend, cfg
        )
        with anyio.fail_after(target.timeout):
            assert await first_line(first, handle, "r", 0) == "started\n"
    async with target.supervisor("second") as second:
        described = await second.describe(handle)
        assert described is not None, handle
        if not durable:
            # Declared not durable: the first Supervisor's close stopped the app.
            assert described.state is AppState.CANCELLED, described
            await anyio.Path(exchange / "go").touch()
            assert (await second.wait(handle, timeout=target.timeout)).state is AppState.CANCELLED
            assert await lines(second, handle, "r", 0, streams="stdout") == ["started\n"]
            return
        # Declared durable: the scheduler still runs it, and a new Supervisor follows it.
        assert described.state in LIVE, described
        async with anyio.create_task_group() as tg:
            followed: list[str] = []

            async def follow() -> None:
                async for line in second.log_iter(handle, "r", 0, should_tail=True):
                    followed.append(line)

            tg.start_soon(follow)
            await anyio.Path(exchange / "go").touch()
            with anyio.fail_after(target.timeout):
                final = await second.wait(handle)
        assert final.state is AppState.SUCCEEDED, final
        assert followed == ["started\n", "finished\n"]


async def test_a_damaged_record_is_reported_as_such_and_hides_no_other_app(
    target: Target, sv: Supervisor, state_dir: Path, cfg: dict[str, object], exchange: Path
) -> None:
    """Issue 19: one damaged record made ``list`` raise (or hang, for a FIFO) for every app,
    and a state.json cut short showed a SUCCEEDED app as SUBMITTED."""
    handles = [
        await sv.submit(app(target.role("r", "echo out", exchange=exchange)), target.backend, cfg)
        for _ in range(2)
    ]
    for handle in handles:
        assert (await sv.wait(handle, timeout=target.timeout)).state is AppState.SUCCEEDED
    good, damaged = handles
    parsed = parse_handle(damaged)
    app_dir = Index(state_dir, target.backend).lookup(parsed.session, parsed.app_id)
    assert app_dir is not None
    state = app_dir / "state.json"
    intact = state.read_bytes()
    stray = state_dir / "index" / target.backend / parsed.session / "stray.json"
    try:
        stray.write_text("{")
        for damage, why in (("cut", "not JSON"), ("fifo", "not a regular file (a FIFO)")):
            state.unlink()
            if damage == "cut":
                state.write_bytes(intact[: len(intact) // 2])
            else:
                os.mkfifo(state)
            async with target.supervisor("observer") as other:
                with anyio.fail_after(target.timeout):
                    listed = {a.app_handle: a for a in await other.list(target.backend)}
                    described = await other.describe(damaged)
                    waited = await other.wait(damaged)
                    logged = await lines(other, damaged, "r", 0, streams="stdout")
            assert listed[good].state is AppState.SUCCEEDED, listed
            found = listed[damaged]
            assert found.state is AppState.UNKNOWN and found.name == "conf", found
            assert found.msg.startswith(f"damaged record: {state}: {why}"), found
            assert listed[f"{target.backend}://{parsed.session}/stray"].state is AppState.UNKNOWN
            assert described is not None and described.state is AppState.UNKNOWN, described
            assert (described.msg, waited.state, waited.msg) == (
                found.msg,
                AppState.UNKNOWN,
                found.msg,
            )
            assert logged == ["out\n"]  # the logs themselves are intact
            entry = next(
                a
                for a in await cli_json(target, "list", "--backend", target.backend)
                if a["handle"] == damaged
            )
            assert (entry["state"], entry["msg"]) == ("UNKNOWN", found.msg), entry
    finally:
        stray.unlink(missing_ok=True)
        state.unlink(missing_ok=True)
        state.write_bytes(intact)
    described = await sv.describe(damaged)
    assert described is not None and described.state is AppState.SUCCEEDED, described
