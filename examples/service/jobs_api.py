"""A small job service: submit, stream logs (SSE), watch, wait and cancel over HTTP.

The Supervisor lives in the Starlette lifespan and is shared through
``app.state``; FastAPI takes the same ``lifespan``. Run it with ``serve.py``
beside this file, which also tells the Supervisor when the server's shutdown
starts (see there and docs/embedding.md). Handles contain ``://`` and ``/``,
so they travel as query parameters.

    GET  /            a small page: the jobs, their live states, the followed job's live log
    POST /jobs        {"cmd": "echo hi", "key": "optional idempotency key"} -> 201 {"handle"}
    GET  /jobs        -> [{"handle", "name", "state"}], this service's jobs, newest first
    GET  /events      -> text/event-stream, one ``app`` event per app state change of any job
    GET  /logs        ?handle=&role=main&k=0  -> text/event-stream, one event per line
    GET  /watch       ?handle=                -> text/event-stream, one event per transition
    GET  /wait        ?handle=&timeout=30     -> 200 {"state"}, 202 still running
    POST /cancel      ?handle=                -> 202

A stream ends with ``event: end`` whose data says why: ``ended`` (the app
ended) or ``shutting down`` (the service is stopping; reconnect elsewhere).
It comes at once at the shutdown, even with lines of a long log still unsent:
the server waits for its open responses before it stops.

A request that cannot be served because the service is stopping gets 503, one
for an app (or replica) nobody knows 404, and bad input 400 naming what is wrong
(a body that is not a JSON object, a malformed handle, a missing parameter, a
timeout or replica that is no number); a body without a string ``cmd`` gets
422. Every route takes any handle, of a job in memory or one known from its
records only (an earlier run of the service, or one that ended long ago).
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from supervisor import (
    AppDef,
    InvalidHandleError,
    Role,
    ShuttingDown,
    SpecError,
    Supervisor,
    UnknownAppError,
    WaitTimeout,
)

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
# Read once at import: a request handler must not block the loop on a file read.
PAGE = (Path(__file__).parent / "page.html").read_text()


@asynccontextmanager
async def lifespan(app: Starlette) -> AsyncIterator[None]:
    # Leaving stops the local apps it started; Docker and Slurm apps run on.
    async with Supervisor(session=os.environ.get("SERVICE_SESSION", "service")) as sv:
        app.state.sv = sv
        yield


def _sv(request: Request) -> Supervisor:
    sv: Supervisor = request.app.state.sv
    return sv


class BadQuery(ValueError):
    """A query parameter missing or of the wrong kind: 400, naming it."""


def _query(request: Request, name: str, default: str | None = None) -> str:
    value = request.query_params.get(name, default)
    if value is None:
        raise BadQuery(f"{name}: required")
    return value


def _number(request: Request, name: str, default: str, kind: type[float] | type[int]) -> float:
    text = _query(request, name, default)
    try:
        return kind(text)
    except ValueError:
        raise BadQuery(f"{name}: expected {kind.__name__}, got {text!r}") from None


def _unavailable() -> Response:
    return JSONResponse({"error": "the service is shutting down"}, status_code=503)


async def submit(request: Request) -> Response:
    try:
        body = await request.json()
    except ValueError:  # not JSON, or not UTF-8: the client's fault, not a 500
        body = None
    if not isinstance(body, dict):
        return JSONResponse({"error": "body: expected a JSON object"}, status_code=400)
    cmd = body.get("cmd")
    if not isinstance(cmd, str):
        return JSONResponse({"error": "cmd: a string is required"}, status_code=422)
    job = AppDef(name="job", roles=[Role(name="main", entrypoint="sh", args=["-c", cmd])])
    try:
        handle = await _sv(request).submit(job, "local", idempotency_key=body.get("key"))
    except ShuttingDown:
        return _unavailable()
    return JSONResponse({"handle": handle}, status_code=201)


def _sse(event: str, data: str) -> str:
    # A data line may not hold a line break; split ones become several data lines.
    lines = data.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    return f"event: {event}\n" + "".join(f"data: {x}\n" for x in lines) + "\n"


async def logs(request: Request) -> Response:
    sv, handle, role = _sv(request), _query(request, "handle"), _query(request, "role", "main")
    k = int(_number(request, "k", "0", int))
    described = await sv.describe(handle)
    if described is None:
        return JSONResponse({"error": "no such app"}, status_code=404)
    if not any(r.name == role and 0 <= k < r.num_replicas for r in described.roles):
        return JSONResponse({"error": f"no replica {role}/{k}"}, status_code=404)

    async def events() -> AsyncIterator[str]:
        # After begin_shutdown a follow still gives every line already in the files,
        # which for a long log outlasts the server's graceful timeout (it then cuts
        # the stream, with no end event): stop at the shutdown instead. aclosing
        # closes the follow now, not whenever the generator is collected.
        async with contextlib.aclosing(sv.log_iter(handle, role, k, should_tail=True)) as lines:
            async for line in lines:
                if sv.shutting_down:
                    break
                yield _sse("line", line.removesuffix("\n"))
        yield _sse("end", "shutting down" if sv.shutting_down else "ended")

    return StreamingResponse(events(), media_type="text/event-stream", headers=SSE_HEADERS)


async def watch(request: Request) -> Response:
    sv, handle = _sv(request), _query(request, "handle")
    # describe, not status: status knows only the apps in memory, and watch also
    # serves one known from its records (a job of an earlier run of the service).
    # It parses the handle too: a malformed one is a 400, as for /logs.
    if await sv.describe(handle) is None:
        return JSONResponse({"error": "no such app"}, status_code=404)

    async def events() -> AsyncIterator[str]:
        try:
            async for t in sv.watch(handle):
                yield _sse("transition", json.dumps(t.to_json()))
        except UnknownAppError:
            # Its records went since describe: only an ended app's are removed (gc).
            pass
        yield _sse("end", "shutting down" if sv.shutting_down else "ended")

    return StreamingResponse(events(), media_type="text/event-stream", headers=SSE_HEADERS)


async def wait(request: Request) -> Response:
    handle, timeout = _query(request, "handle"), _number(request, "timeout", "30", float)
    try:
        status = await _sv(request).wait(handle, timeout=timeout)
    except UnknownAppError:
        return JSONResponse({"error": "no such app"}, status_code=404)
    except WaitTimeout:
        return JSONResponse({"state": "RUNNING"}, status_code=202)
    except ShuttingDown:
        return _unavailable()
    return JSONResponse({"state": status.state.name, "restarts": status.num_restarts})


async def page(request: Request) -> Response:
    return HTMLResponse(PAGE)


async def jobs(request: Request) -> Response:
    sv = _sv(request)
    mine = f"local://{sv.session}/"  # the state dir may hold other sessions' apps too
    listed = [a for a in await sv.list("local") if a.app_handle.startswith(mine)]
    listed.sort(key=lambda a: a.times.submitted or 0, reverse=True)
    return JSONResponse(
        [{"handle": a.app_handle, "name": a.name, "state": a.state.name} for a in listed]
    )


async def app_events(request: Request) -> Response:
    sv = _sv(request)

    async def events() -> AsyncIterator[str]:
        async with sv.events() as stream:
            async for event in stream:
                if event.transition.role is None:  # app level only: what the list shows
                    data = {"handle": event.handle, "state": event.transition.dest}
                    yield _sse("app", json.dumps(data))
        yield _sse("end", "shutting down")

    return StreamingResponse(events(), media_type="text/event-stream", headers=SSE_HEADERS)


async def cancel(request: Request) -> Response:
    try:
        await _sv(request).cancel(_query(request, "handle"))
    except UnknownAppError:
        return JSONResponse({"error": "no such app"}, status_code=404)
    return JSONResponse({}, status_code=202)


async def bad_request(request: Request, exc: Exception) -> Response:
    return JSONResponse({"error": str(exc)}, status_code=400)


app = Starlette(
    lifespan=lifespan,
    # A SpecError names every field at fault (a timeout < 0, an idempotency key too long).
    exception_handlers={
        InvalidHandleError: bad_request,
        SpecError: bad_request,
        BadQuery: bad_request,
    },
    routes=[
        Route("/", page),
        Route("/jobs", submit, methods=["POST"]),
        Route("/jobs", jobs, methods=["GET"]),
        Route("/events", app_events),
        Route("/logs", logs),
        Route("/watch", watch),
        Route("/wait", wait),
        Route("/cancel", cancel, methods=["POST"]),
    ],
)
