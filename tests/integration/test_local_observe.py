"""What a service can observe: log records, the events() stream and OpenTelemetry metrics.

Real replicas on the local backend. Metrics are read with the OpenTelemetry SDK's
in-memory reader, as an application's own SDK set-up would see them.
"""

from __future__ import annotations

import logging
import os
import sys
import textwrap
from collections.abc import Sequence
from pathlib import Path

import anyio
import pytest

from supervisor import (
    AppEvent,
    AppState,
    EventsOverflowError,
    SpecError,
    Supervisor,
    Transition,
)
from supervisor.backends.base import Request
from supervisor.backends.local import LocalBackend
from supervisor.events import ReplicaKey

from ..otel_reader import points, reader, total
from .helpers import app, py_role

pytestmark = [pytest.mark.anyio, pytest.mark.integration]

FAIL_ONCE = (
    "import os, sys, pathlib\n"
    "marker = pathlib.Path(sys.argv[1])\n"
    "if not marker.exists():\n"
    "    marker.write_text('x'); sys.exit(7)\n"
)


def _records(caplog: pytest.LogCaptureFixture, handle: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if getattr(r, "handle", None) == handle]


async def test_every_transition_retry_and_end_is_a_log_record_with_structured_fields(
    state_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="supervisor")
    role = py_role("w", FAIL_ONCE, args=[str(tmp_path / "failed-once")], max_retries=1)
    async with Supervisor(session="obs") as sv:
        handle = await sv.submit(app(role, name="logged"), "local")
        status = await sv.wait(handle)
        history = list((await sv.describe(handle)).transitions)  # type: ignore[union-attr]
    assert status.state is AppState.SUCCEEDED
    records = _records(caplog, handle)
    assert all(r.name == "supervisor" for r in records)
    # Every field on every record: one format string serves them all.
    fields = "%(handle)s %(role)s %(replica)s %(source)s %(dest)s %(attempt)s %(reason)s"
    assert all(logging.Formatter(fields).format(r) for r in records)
    transitions = [r for r in records if r.dest is not None]  # type: ignore[attr-defined]
    # One record per transition, app and replica level, in the app's order.
    assert [(r.role, r.replica, r.source, r.dest) for r in transitions] == [  # type: ignore[attr-defined]
        (t.role, t.replica_id, t.source, t.dest) for t in history
    ]
    app_level = [r for r in transitions if r.role is None]  # type: ignore[attr-defined]
    assert app_level[-1].dest == "SUCCEEDED" and app_level[-1].levelno == logging.INFO  # type: ignore[attr-defined]
    retried = [r for r in transitions if "exited with code 7" in r.reason]  # type: ignore[attr-defined]
    assert [(r.role, r.source, r.dest) for r in retried] == [("w", "RUNNING", "PENDING")]  # type: ignore[attr-defined]
    restarts = [r for r in records if "restart" in r.getMessage() and r.dest is None]  # type: ignore[attr-defined]
    assert len(restarts) == 1
    assert (restarts[0].role, restarts[0].replica) == ("w", 0)  # type: ignore[attr-defined]
    assert restarts[0].reason  # type: ignore[attr-defined]


async def test_an_end_is_logged_counted_and_streamed_before_wait_returns(
    state_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The end is told to the observer while the final record is written (off the way
    to ``wait``), yet never after ``wait`` returns: read with no await in between."""
    caplog.set_level(logging.DEBUG, logger="supervisor")
    reader()
    ended = {"asupervisor.state": "SUCCEEDED", "asupervisor.scope": "app"}
    async with Supervisor(session="obs") as sv:
        stream = sv.events()
        for i in range(5):
            before = total("asupervisor.transitions", **ended)
            handle = await sv.submit(app(py_role("w", "pass"), name=f"told{i}"), "local")
            status = await sv.wait(handle)
            assert status.state is AppState.SUCCEEDED
            app_level = [r for r in _records(caplog, handle) if r.role is None]  # type: ignore[attr-defined]
            assert app_level[-1].dest == "SUCCEEDED"  # type: ignore[attr-defined]
            assert total("asupervisor.transitions", **ended) == before + 1
        # The stream has every app's end already: read to it without waiting.
        ends: list[str] = []
        with anyio.fail_after(0):
            while len(ends) < 5:
                event = await stream.__anext__()
                if event.transition.role is None and event.transition.dest == "SUCCEEDED":
                    ends.append(event.handle)
        assert len(set(ends)) == 5


async def test_a_failed_app_is_a_warning_naming_it(
    state_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="supervisor")
    async with Supervisor(session="obs") as sv:
        handle = await sv.submit(app(py_role("w", "raise SystemExit(3)"), name="bad"), "local")
        await sv.wait(handle)
    ends = [r for r in _records(caplog, handle) if getattr(r, "role", 0) is None]
    assert ends[-1].dest == "FAILED" and ends[-1].levelno == logging.WARNING  # type: ignore[attr-defined]
    assert handle in ends[-1].getMessage()


class _RestartBreaks(LocalBackend):
    """A local backend whose restarts raise an unexpected error.

    A fake, on purpose: a bug inside a backend is a fault the real one cannot
    produce on demand. Everything else (processes, files) is real.
    """

    async def launch(self, request: Request, sink, tasks):  # type: ignore[no-untyped-def]
        runtime = await super().launch(request, sink, tasks)

        async def broken(attempts: Sequence[tuple[ReplicaKey, int]], reason: str) -> None:
            raise RuntimeError("restart exploded")

        runtime.restart = broken  # type: ignore[method-assign]
        return runtime


async def test_an_internal_error_is_logged_with_its_traceback(
    state_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="supervisor")
    role = py_role("w", FAIL_ONCE, args=[str(tmp_path / "failed-once")], max_retries=1)
    async with Supervisor(session="obs", backends={"local": _RestartBreaks}) as sv:
        handle = await sv.submit(app(role, name="broken"), "local")
        status = await sv.wait(handle)
    assert status.state is AppState.UNKNOWN
    errors = [r for r in _records(caplog, handle) if r.levelno == logging.ERROR]
    assert len(errors) == 1
    assert errors[0].exc_info is not None
    assert "restart exploded" in str(errors[0].exc_info[1])
    assert errors[0].exc_info[2] is not None  # the traceback came along


def _by_app(events: list[AppEvent]) -> dict[str, list[Transition]]:
    grouped: dict[str, list[Transition]] = {}
    for event in events:
        grouped.setdefault(event.handle, []).append(event.transition)
    return grouped


async def test_events_carries_every_transition_of_every_app_in_order(state_dir: Path) -> None:
    seen: list[AppEvent] = []
    async with Supervisor(session="obs") as sv:
        stream = sv.events()

        async def read() -> None:
            async for event in stream:
                seen.append(event)

        async with anyio.create_task_group() as tg:
            tg.start_soon(read)
            handles = [
                await sv.submit(app(py_role("w", "pass", num_replicas=2), name=f"e{i}"), "local")
                for i in range(3)
            ]
            for handle in handles:
                await sv.wait(handle)
            histories = {h: list((await sv.describe(h)).transitions) for h in handles}  # type: ignore[union-attr]
            await sv.close()  # ends the stream, and with it the reader
    grouped = _by_app(seen)
    assert set(grouped) == set(handles)
    for handle in handles:
        assert grouped[handle] == histories[handle]
        assert grouped[handle][-1].dest == "SUCCEEDED"
    assert {event.backend for event in seen} == {"local"}


ROOT = Path(__file__).resolve().parents[2]

OWNER = textwrap.dedent(
    """
    import sys
    import anyio
    from supervisor import AppDef, Role, Supervisor

    # Says it runs, then waits for the test's go-ahead file.
    CODE = (
        "import os, sys, time\\n"
        "print('ready', flush=True)\\n"
        "while not os.path.exists(sys.argv[1]):\\n"
        "    time.sleep(0.02)\\n"
    )

    async def main() -> None:
        role = Role(name="w", entrypoint=sys.executable, args=["-c", CODE, sys.argv[1]])
        async with Supervisor(session="obs") as sv:
            handle = await sv.submit(AppDef(name="owned", roles=[role]), "local")
            print(handle, flush=True)
            await sv.wait(handle)

    anyio.run(main)
    """
)


def _steps(transitions: Sequence[Transition]) -> list[tuple[int, str, str, str]]:
    """What a transition says, without its time: the end no journal holds is timed as read."""
    return [(t.seq, t.scope, t.source, t.dest) for t in transitions]


@pytest.mark.parametrize("end", ["succeeds", "owner-killed"])
async def test_events_carries_an_app_observed_from_another_process_from_the_attach_on(
    state_dir: Path, tmp_path: Path, end: str
) -> None:
    """``attach`` while its owner (another process) lives observes the app: the stream
    carries what is recorded from then on, once each, in order, to the end ``watch``
    gives (the steps to UNKNOWN when the owner is killed first). It carried nothing."""
    go = tmp_path / "go"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }
    seen: list[AppEvent] = []
    ended = anyio.Event()
    async with await anyio.open_process([sys.executable, "-c", OWNER, str(go)], env=env) as owner:
        try:
            assert owner.stdout is not None
            with anyio.fail_after(30):
                handle = (await owner.stdout.receive()).decode().strip()
            assert handle.startswith("local://obs/"), handle
            async with Supervisor(session="obs") as sv:
                stream = sv.events()  # opened before the attach: nothing before it comes

                async def read() -> None:
                    async for event in stream:
                        seen.append(event)
                        if event.transition.role is None and event.transition.dest in (
                            "SUCCEEDED",
                            "UNKNOWN",
                        ):
                            ended.set()

                async with anyio.create_task_group() as tg:
                    tg.start_soon(read)
                    with anyio.fail_after(30):
                        async for line in sv.log_iter(handle, "w", 0, should_tail=True):
                            assert line == "ready\n"
                            break
                        before = await sv.describe(handle)  # the replica waits: no change
                        assert before is not None and before.state is AppState.RUNNING
                        recorded = len(before.transitions)
                        assert (await sv.attach(handle)).state is AppState.RUNNING
                        assert sv.followed() == []  # observed, not owned
                        if end == "succeeds":
                            await anyio.Path(go).touch()
                        else:
                            owner.kill()
                        watched = [t async for t in sv.watch(handle)]  # to the app's end
                    with anyio.move_on_after(10):  # the follow reads the records as watch does
                        await ended.wait()
                    await sv.close()  # ends the stream: nothing more was in it
        finally:
            if owner.returncode is None:
                await anyio.Path(go).touch()  # the app ends, and its owner with it
            with anyio.fail_after(30):
                await owner.wait()
    assert ended.is_set(), f"the stream carried no end of the observed app: {seen}"
    assert {e.handle for e in seen} == {handle}
    after = _steps(watched)[recorded:]
    assert after, watched
    assert _steps([e.transition for e in seen]) == after
    assert after[-1][1:] == ("app", "RUNNING", "SUCCEEDED" if end == "succeeds" else "UNKNOWN")


async def test_a_reader_that_falls_behind_is_told_how_many_it_missed(state_dir: Path) -> None:
    async with Supervisor(session="obs") as sv:
        stream = sv.events(max_buffer=3)
        handle = await sv.submit(app(py_role("w", "pass", num_replicas=4), name="flood"), "local")
        await sv.wait(handle)
        total_transitions = len((await sv.describe(handle)).transitions)  # type: ignore[union-attr]
        first = [await stream.__anext__() for _ in range(3)]
        with pytest.raises(EventsOverflowError, match=f"{total_transitions - 3} events behind"):
            await stream.__anext__()
        # The stream goes on after the gap: the next app's events arrive.
        again = await sv.submit(app(py_role("w", "pass"), name="after"), "local")
        nxt = await stream.__anext__()
        await sv.wait(again)
        await stream.aclose()
    assert [e.handle for e in first] == [handle] * 3
    assert nxt.handle == again


async def test_the_gap_is_told_where_it_is_before_any_later_event(state_dir: Path) -> None:
    """A reader that keeps pace after a burst: the loss comes between the events before
    it and those after it. It was told only once the stream was empty, after newer
    events (or never, while they kept coming)."""
    async with Supervisor(session="obs") as sv:
        stream = sv.events(max_buffer=3)
        flood = await sv.submit(app(py_role("w", "pass", num_replicas=4), name="flood"), "local")
        await sv.wait(flood)
        first = await stream.__anext__()  # room for one more: the next app's first event
        after = await sv.submit(app(py_role("w", "pass"), name="after"), "local")
        await sv.wait(after)
        told = [await stream.__anext__() for _ in range(2)]
        with pytest.raises(EventsOverflowError, match="events behind"):
            await stream.__anext__()
        rest = [await stream.__anext__()]  # the stream goes on after the gap
        await stream.aclose()
    assert {e.handle for e in [first, *told]} == {flood}
    assert rest[0].handle == after


async def test_events_end_when_the_supervisor_closes_and_bad_buffer_is_refused(
    state_dir: Path,
) -> None:
    async with Supervisor(session="obs") as sv:
        for bad in (0, "10", 2.5, True):
            with pytest.raises(SpecError, match="max_buffer"):
                sv.events(max_buffer=bad)  # type: ignore[arg-type]
        stream = sv.events()
        ended = anyio.Event()

        async def read() -> None:
            async for _ in stream:
                pass
            ended.set()

        sv._task_group().start_soon(read)
        await sv.close()
        with anyio.fail_after(5):
            await ended.wait()
    after = sv.events()
    assert [e async for e in after] == []


async def test_metrics_count_transitions_retries_latencies_and_apps_by_state(
    state_dir: Path, tmp_path: Path
) -> None:
    reader()  # the SDK is set up before the Supervisor records anything
    before = {
        "ok": total(
            "asupervisor.transitions",
            **{"asupervisor.state": "SUCCEEDED", "asupervisor.scope": "app"},
        ),
        "retries": total("asupervisor.retries", **{"asupervisor.backend": "local"}),
        "submit": total("asupervisor.submit.duration", **{"asupervisor.backend": "local"}),
        "wait": total("asupervisor.wait.duration", **{"asupervisor.backend": "local"}),
    }
    role = py_role("w", FAIL_ONCE, args=[str(tmp_path / "failed-once")], max_retries=1)
    async with Supervisor(session="obs") as sv:
        handle = await sv.submit(app(role, name="measured"), "local")
        await sv.wait(handle)
        await sv.wait(handle)  # ended already: counted too, as every wait that returns
        running = await sv.submit(
            app(py_role("s", "import time; time.sleep(60)", num_replicas=2)), "local"
        )
        async for t in sv.watch(running):
            if t.role is None and t.dest == "RUNNING":
                break
        apps_now = total(
            "asupervisor.apps", **{"asupervisor.backend": "local", "asupervisor.state": "RUNNING"}
        )
        replicas_now = total(
            "asupervisor.replicas",
            **{"asupervisor.backend": "local", "asupervisor.state": "RUNNING"},
        )
    assert (
        total(
            "asupervisor.transitions",
            **{"asupervisor.state": "SUCCEEDED", "asupervisor.scope": "app"},
        )
        == before["ok"] + 1
    )
    assert total("asupervisor.retries", **{"asupervisor.backend": "local"}) == before["retries"] + 1
    assert (
        total("asupervisor.submit.duration", **{"asupervisor.backend": "local"})
        == before["submit"] + 2
    )
    assert (
        total("asupervisor.wait.duration", **{"asupervisor.backend": "local"}) == before["wait"] + 2
    )
    assert apps_now >= 1 and replicas_now >= 2
    # A closed Supervisor is no longer counted: its states read 0 (not a series that
    # stopped at its last count, which a dashboard would show as still running).
    for name in ("asupervisor.apps", "asupervisor.replicas"):
        counted = [
            p.value
            for p in points(name)
            if p.attributes == {"asupervisor.backend": "local", "asupervisor.state": "RUNNING"}
        ]
        assert counted == [0], (name, counted)
