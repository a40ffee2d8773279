"""The service recipe of examples/service, served by a real uvicorn on a loopback port.

The server runs as its own process (``examples/service/serve.py``, as a user
would start it) and is driven over HTTP with httpx: submit, logs and watch as
server-sent events, wait, cancel; then 100 log followers, a watch and a wait
stay open while it gets SIGTERM. uvicorn waits for open responses before its
lifespan shutdown, so only ``begin_shutdown`` (called from the server's signal
handling) lets it stop promptly: every stream must end with ``event: end``
saying why, the wait must be answered 503, the server must exit, and no process
it started may be left. The same holds for a stream of a log millions of lines
long; a body that is no JSON object gets 400, and ``/watch`` answers a malformed
handle, and a job of the server's previous run, as ``/logs`` does.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import httpx
import pytest
from anyio.abc import Process

from .helpers import pid_alive, until

pytestmark = [pytest.mark.anyio, pytest.mark.integration]

ROOT = Path(__file__).resolve().parents[2]
SERVE = ROOT / "examples" / "service" / "serve.py"
FOLLOWERS = 100
# The issue asks for an exit within 3 s of SIGTERM with the streams open. It takes
# 0.2-0.4 s on a 2-core machine at a load of 24; without begin_shutdown the open
# streams would hold the server for the app's 60 s.
EXIT_BOUND_S = 3
# The app's pid (its process then sleeps on). ``$$`` is the escape of ``$`` in an
# AppDef's arguments (its macros), so the shell gets ``echo $$``.
LONG = "echo $$$$; exec sleep 60"
# Lines already in a log when SIGTERM comes. Sent one event each, they take uvicorn
# far longer to send than its 5 s graceful timeout (50,000-100,000 a second on a
# 2-core machine): a stream that read them out before ending would be cut without
# its end, and one fast client makes the whole first read (1 MiB) go in one turn.
BACKLOG = 3_000_000


@asynccontextmanager
async def served(tmp_path: Path) -> AsyncIterator[tuple[Process, str]]:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
        "SERVICE_SESSION": "recipe",
    }
    # Appended to: a test that restarts the server keeps both servers' logs.
    with (tmp_path / "uvicorn.log").open("ab") as log:
        argv = [sys.executable, str(SERVE), "--host", "127.0.0.1", "--port", "0"]
        async with await anyio.open_process(argv, env=env, stderr=log) as server:
            try:
                assert server.stdout is not None
                seen = b""
                with anyio.fail_after(60):
                    while b"\n" not in seen:
                        seen += await server.stdout.receive()
                first = seen.decode().splitlines()[0]
                assert first.startswith("listening on http://127.0.0.1:"), first
                yield server, first.removeprefix("listening on ")
            finally:
                if server.returncode is None:
                    server.kill()


async def sse(
    client: httpx.AsyncClient, path: str, **params: str
) -> AsyncIterator[tuple[str, str]]:
    """(event, data) of a server-sent event stream, to its end."""
    async with client.stream("GET", path, params=params) as response:
        assert response.status_code == 200, await response.aread()
        event, data = "message", list[str]()
        async for line in response.aiter_lines():
            if line == "":
                yield event, "\n".join(data)
                event, data = "message", []
            elif line.startswith("event: "):
                event = line.removeprefix("event: ")
            elif line.startswith("data: "):
                data.append(line.removeprefix("data: "))


async def submit(client: httpx.AsyncClient, cmd: str) -> str:
    response = await client.post("/jobs", json={"cmd": cmd})
    assert response.status_code == 201, response.text
    handle: str = response.json()["handle"]
    return handle


def descendants(pid: int) -> set[int]:
    """Every process under ``pid`` now (from /proc), however deep."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
    found: set[int] = set()
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


async def test_submit_logs_watch_wait_and_cancel_over_http(tmp_path: Path, state_dir: Path) -> None:
    async with (
        served(tmp_path) as (server, base),
        httpx.AsyncClient(base_url=base, timeout=60) as client,
    ):
        handle = await submit(client, "echo hi; echo bye")
        waited = await client.get("/wait", params={"handle": handle, "timeout": "60"})
        assert waited.status_code == 200 and waited.json()["state"] == "SUCCEEDED", waited.text
        events = [e async for e in sse(client, "/logs", handle=handle)]
        assert events == [("line", "hi"), ("line", "bye"), ("end", "ended")]
        watched = [e async for e in sse(client, "/watch", handle=handle)]
        assert watched[-1] == ("end", "ended")
        app_level = [json.loads(d) for e, d in watched[:-1] if json.loads(d)["role"] is None]
        assert app_level[-1]["dest"] == "SUCCEEDED"

        long = await submit(client, LONG)
        running = await client.get("/wait", params={"handle": long, "timeout": "0.2"})
        assert running.status_code == 202
        assert (await client.post("/cancel", params={"handle": long})).status_code == 202
        cancelled = await client.get("/wait", params={"handle": long, "timeout": "60"})
        assert cancelled.json()["state"] == "CANCELLED"
        unknown = await client.get("/wait", params={"handle": "local://recipe/nope"})
        assert unknown.status_code == 404
        malformed = await client.get("/logs", params={"handle": "no handle"})
        assert malformed.status_code == 400, malformed.text
        # Bad input is a 400 naming the parameter (these were 500s), an unknown replica a 404.
        for path, params, field in [
            ("/wait", {"handle": handle, "timeout": "soon"}, "timeout"),
            ("/wait", {"handle": handle, "timeout": "-1"}, "timeout"),
            ("/wait", {}, "handle"),
            ("/logs", {"handle": handle, "k": "first"}, "k"),
            ("/watch", {}, "handle"),
        ]:
            refused = await client.get(path, params=params)
            assert refused.status_code == 400, (path, params, refused.text)
            assert field in refused.json()["error"], refused.text
        assert (await client.post("/cancel")).status_code == 400
        unknown_replica = await client.get("/logs", params={"handle": handle, "k": "7"})
        assert unknown_replica.status_code == 404, unknown_replica.text
        keyed = await client.post("/jobs", json={"cmd": "true", "key": 5})
        assert keyed.status_code == 400 and "idempotency_key" in keyed.json()["error"]
        server.terminate()
        with anyio.fail_after(EXIT_BOUND_S):
            await server.wait()


async def test_sigterm_with_100_followers_open_ends_every_stream_and_exits(
    tmp_path: Path, state_dir: Path
) -> None:
    limits = httpx.Limits(max_connections=FOLLOWERS + 10, max_keepalive_connections=0)
    async with (
        served(tmp_path) as (server, base),
        httpx.AsyncClient(base_url=base, timeout=60, limits=limits) as client,
    ):
        handle = await submit(client, LONG)
        ends: list[tuple[str, str]] = []
        firsts: list[str] = []
        all_following = anyio.Event()
        watch_end: list[tuple[str, str]] = []
        wait_answer: list[httpx.Response] = []

        async def follow() -> None:
            async for event, data in sse(client, "/logs", handle=handle):
                if event == "line":
                    firsts.append(data)
                    if len(firsts) == FOLLOWERS:
                        all_following.set()
                else:
                    ends.append((event, data))

        async def watch() -> None:
            async for event, data in sse(client, "/watch", handle=handle):
                if event == "end":
                    watch_end.append((event, data))

        async def wait() -> None:
            wait_answer.append(await client.get("/wait", params={"handle": handle}))

        async with anyio.create_task_group() as tg:
            tg.start_soon(wait)  # first: it must reach the server before the signal
            tg.start_soon(watch)
            for _ in range(FOLLOWERS):
                tg.start_soon(follow)
            with anyio.fail_after(120):
                await all_following.wait()
            pid = int(firsts[0])
            assert set(firsts) == {str(pid)}
            started = descendants(server.pid)
            assert pid in started
            server.send_signal(signal.SIGTERM)
            with anyio.fail_after(EXIT_BOUND_S):
                code = await server.wait()
        # uvicorn re-raises the signal it handled once it has shut down.
        assert code in (0, -signal.SIGTERM), code
        assert ends == [("end", "shutting down")] * FOLLOWERS
        assert watch_end == [("end", "shutting down")]
        assert [r.status_code for r in wait_answer] == [503]
        assert [p for p in started if pid_alive(p)] == []


async def test_sigterm_ends_a_log_stream_with_a_backlog_at_once(
    tmp_path: Path, state_dir: Path
) -> None:
    """A follow of a log millions of lines long ends at SIGTERM, not at the file's end.

    ``log_iter`` reads on to the end of the files after ``begin_shutdown``; the
    service's stream used to as well, so uvicorn waited for it its whole graceful
    timeout and then cut it, with no ``end`` event (and a CancelledError traceback).
    And a read's half a million short lines went out without the loop getting a
    turn, which held off the signal's ``begin_shutdown`` for seconds. The client
    reads as fast as it can (the bytes, not event by event), as curl would.
    """
    written = tmp_path / "written"
    event = b"event: line\n"
    end = b"event: end\ndata: shutting down\n\n"
    async with (
        served(tmp_path) as (server, base),
        httpx.AsyncClient(base_url=base, timeout=60) as client,
    ):
        cmd = f"yes x | head -n {BACKLOG}; touch {shlex.quote(str(written))}; exec sleep 60"
        handle = await submit(client, cmd)
        await until(written.exists, 60)  # the whole backlog is in the log
        lines = 0
        last = b""  # the stream's last bytes
        reading = anyio.Event()

        async def follow() -> None:
            nonlocal lines, last
            async with client.stream("GET", "/logs", params={"handle": handle}) as response:
                assert response.status_code == 200, await response.aread()
                async for chunk in response.aiter_bytes():
                    # An event cut by the chunk's start is counted now, none twice.
                    lines += (last[-len(event) + 1 :] + chunk).count(event)
                    last = (last + chunk)[-len(end) :]
                    reading.set()

        async with anyio.create_task_group() as tg:
            tg.start_soon(follow)
            with anyio.fail_after(60):
                await reading.wait()
            server.send_signal(signal.SIGTERM)
            # Well before uvicorn's graceful timeout (5 s) would have cut the stream.
            with anyio.fail_after(EXIT_BOUND_S):
                code = await server.wait()
        assert code in (0, -signal.SIGTERM), code
        assert last == end
        assert lines < BACKLOG  # it stopped, rather than reading the backlog out fast
    assert "Traceback" not in (tmp_path / "uvicorn.log").read_text()


async def test_a_body_that_is_not_json_is_refused_with_400(tmp_path: Path, state_dir: Path) -> None:
    async with (
        served(tmp_path) as (server, base),
        httpx.AsyncClient(base_url=base, timeout=60) as client,
    ):
        for body in [b"notjson", b"", b'{"cmd": ', b"\xff", b'["echo hi"]']:
            refused = await client.post(
                "/jobs", content=body, headers={"Content-Type": "application/json"}
            )
            assert refused.status_code == 400, (body, refused.text)
            assert refused.json()["error"].startswith("body:"), refused.text
        # A JSON body whose cmd is wrong stays a 422, and the service serves on.
        wrong = await client.post("/jobs", json={"cmd": 5})
        assert wrong.status_code == 422, wrong.text
        handle = await submit(client, "true")
        waited = await client.get("/wait", params={"handle": handle, "timeout": "60"})
        assert waited.json()["state"] == "SUCCEEDED", waited.text
        server.terminate()
        with anyio.fail_after(EXIT_BOUND_S):
            await server.wait()
    assert "Traceback" not in (tmp_path / "uvicorn.log").read_text()


async def test_watch_refuses_a_malformed_handle_and_serves_jobs_after_a_restart(
    tmp_path: Path, state_dir: Path
) -> None:
    """``/watch`` answers as ``/logs`` does, from the records of an app not in memory."""
    async with (
        served(tmp_path) as (server, base),
        httpx.AsyncClient(base_url=base, timeout=60) as client,
    ):
        handle = await submit(client, "echo hi")
        waited = await client.get("/wait", params={"handle": handle, "timeout": "60"})
        assert waited.json()["state"] == "SUCCEEDED", waited.text
        before = [e async for e in sse(client, "/watch", handle=handle)]
        for path in ["/logs", "/watch"]:
            malformed = await client.get(path, params={"handle": "no handle"})
            assert malformed.status_code == 400, (path, malformed.text)
            unknown = await client.get(path, params={"handle": "local://recipe/nope"})
            assert unknown.status_code == 404, (path, unknown.text)
        server.terminate()
        with anyio.fail_after(EXIT_BOUND_S):
            await server.wait()

    # A new server process: the job is known only from its records.
    async with (
        served(tmp_path) as (server, base),
        httpx.AsyncClient(base_url=base, timeout=60) as client,
    ):
        listed = (await client.get("/jobs")).json()
        assert [j["handle"] for j in listed] == [handle], listed
        after = [e async for e in sse(client, "/watch", handle=handle)]
        assert after == before, (before, after)
        assert after[-1] == ("end", "ended")
        logged = [e async for e in sse(client, "/logs", handle=handle)]
        assert logged == [("line", "hi"), ("end", "ended")]
        server.terminate()
        with anyio.fail_after(EXIT_BOUND_S):
            await server.wait()
