"""The few Engine API calls the backend makes, over aiodocker, with errors translated.

Two calls are streamed by hand through aiodocker's request layer rather than
its helpers: the event stream (read as JSON lines, so one connection serves
every container of a Supervisor) and the log stream (whose 8-byte frame
headers say which of stdout/stderr each chunk came from, which aiodocker's
``log()`` throws away).

Engine differences tolerated here: Podman answers a name conflict with 500
instead of 409, sometimes a container that is gone with 500 "no such
container" instead of 404, and names the exit event ``died`` instead of ``die``.
"""

from __future__ import annotations

import contextlib
import functools
import json
import re
import struct
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from datetime import datetime
from typing import Any, Literal, ParamSpec, TypeVar
from urllib.parse import quote

import anyio

from supervisor.errors import BackendError, MissingExtraError, SubmitError

try:
    import aiodocker
    import aiohttp
except ModuleNotFoundError as e:  # the core install: the docker extra brings both
    raise MissingExtraError("docker", e.name or "aiodocker", what="the docker backend") from e

__all__ = ["EVENTS_REOPEN_S", "EXIT_ACTIONS", "Engine", "StreamName", "engine_time"]

StreamName = Literal["stdout", "stderr"]
EXIT_ACTIONS = frozenset({"die", "died"})
EVENTS_REOPEN_S = 1.0
"""The pause before an event stream the engine dropped is opened again (a back-off)."""
NETWORK_ENDPOINTS_S = 60.0
"""How long a network whose containers are gone may still show their endpoints."""
_FRAME = struct.Struct(">BxxxL")
_STREAMS: dict[int, StreamName] = {1: "stdout", 2: "stderr"}
P = ParamSpec("P")
T = TypeVar("T")


# RFC 3339 with up to nanoseconds (Python's parser takes microseconds at most).
_RFC3339 = re.compile(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d+))?(Z|[+-]\d\d:\d\d)")


def engine_time(text: object) -> float | None:
    """Epoch seconds of a time the engine wrote (``State.StartedAt``); None for none.

    Both engines write the zero time (year 1) for a moment that never came.
    """
    found = _RFC3339.fullmatch(text) if isinstance(text, str) else None
    if found is None or found.group(1).startswith("0001-"):
        return None
    zone = "+00:00" if found.group(3) == "Z" else found.group(3)
    whole = datetime.fromisoformat(found.group(1) + zone).timestamp()
    return whole + float("0." + (found.group(2) or "0"))


def _transient(e: aiodocker.DockerError) -> bool:
    """Connection trouble and server errors may pass; a refused request will not."""
    return e.status >= 500 and "no such image" not in e.message.lower()


def _error(e: aiodocker.DockerError, what: str, *, submit: bool = False) -> BackendError:
    cls = SubmitError if submit else BackendError
    err = cls(f"{what}: {e.message} (engine status {e.status})", transient=_transient(e))
    err.__cause__ = e
    return err


def _translated(func: Callable[P, Awaitable[T]]) -> Callable[P, Awaitable[T]]:
    """A dropped connection or a timeout becomes a transient BackendError, like engine errors."""

    @functools.wraps(func)
    async def call(*args: P.args, **kwargs: P.kwargs) -> T:
        try:
            return await func(*args, **kwargs)
        except (TimeoutError, aiohttp.ClientError) as e:
            what = func.__name__.replace("_", " ")
            raise BackendError(f"{what}: the engine did not answer ({e!r})", transient=True) from e
        except RuntimeError as e:
            engine = args[0] if args else None
            if isinstance(engine, Engine) and engine.closed:
                raise engine.closed_error() from e
            raise

    return call


def _gone(e: aiodocker.DockerError) -> bool:
    """The container (or network) is not there: 404, or Podman's 500 "no such container"
    for one removed while the request was on its way (``docker rm -f`` from outside)."""
    return e.status == 404 or "no such container" in e.message.lower()


def _conflict(e: aiodocker.DockerError) -> bool:
    return e.status == 409 or "already in use" in e.message or "already exists" in e.message


class Engine:
    """One engine address; the client is made on first use, inside the event loop."""

    def __init__(self, host: str) -> None:
        self.host = host
        self._docker: aiodocker.Docker | None = None
        self._closed = False

    @property
    def closed(self) -> bool:
        return self._closed

    def closed_error(self) -> BackendError:
        """What a call meets once ``aclose`` began: the same error, whether it came before
        the call or under it (aiohttp then says only "Session is closed", a RuntimeError)."""
        return BackendError(f"the connection to {self.host} is closed", transient=False)

    def client(self) -> aiodocker.Docker:
        if self._closed:
            raise self.closed_error()
        if self._docker is None:
            try:
                self._docker = aiodocker.Docker(
                    url=self.host, timeout=aiohttp.ClientTimeout(total=120)
                )
            except ValueError as e:  # an address it cannot use (no scheme): the dry run says so
                raise BackendError(f"engine {self.host!r}: {e}", transient=False) from e
        return self._docker

    async def aclose(self) -> None:
        self._closed = True
        if self._docker is not None:
            docker, self._docker = self._docker, None
            await docker.close()

    @asynccontextmanager
    async def _response(
        self, path: str, method: str = "GET", params: Mapping[str, str] | None = None
    ) -> AsyncIterator[aiohttp.ClientResponse]:
        """A raw response, closed on the way out (aiodocker's ``_query`` leaves that to us)."""
        try:
            response = await self.client()._do_query(
                path, method, params=dict(params or {}), timeout=aiohttp.ClientTimeout()
            )
        except RuntimeError as e:
            if self._closed:  # closed under the request (its Supervisor is closing)
                raise self.closed_error() from e
            raise
        try:
            yield response
        finally:
            response.close()

    # ------------------------------------------------------------------ images
    @_translated
    async def ensure_image(self, image: str) -> None:
        """Pull ``image`` only when the engine does not have it."""
        docker = self.client()
        try:
            await docker.images.inspect(image)
            return
        except aiodocker.DockerError as e:
            if e.status != 404:
                raise _error(e, f"cannot look up image {image!r}", submit=True) from e
        try:
            await docker.images.pull(image)
        except aiodocker.DockerError as e:
            raise SubmitError(
                f"image {image!r} is not on the engine at {self.host} and pulling it failed: "
                f"{e.message}",
                transient=False,
            ) from e

    # ---------------------------------------------------------------- networks
    @_translated
    async def create_network(self, body: Mapping[str, Any]) -> str:
        try:
            network = await self.client().networks.create(dict(body))
        except aiodocker.DockerError as e:
            what = f"cannot create network {body.get('Name')!r}"
            if "address pool" in e.message.lower():
                # dockerd's default pools hold 31 networks: one per app, 31 apps at once.
                raise SubmitError(
                    f"{what}: the engine has no free address pool for it ({e.message}); each "
                    "app has a network of its own, so this engine runs only so many apps at "
                    "once: wait for some to end, or give it larger pools (dockerd "
                    "--default-address-pool base=10.200.0.0/16,size=24)",
                    transient=True,  # passes once other apps end and free their networks
                ) from e
            raise _error(e, what, submit=True) from e
        return str(network.id)

    @_translated
    async def remove_network(self, name: str, endpoints: Sequence[str] = ()) -> None:
        """Remove it (gone already is fine).

        dockerd under load still shows the endpoints of containers it has just removed
        ("has active endpoints"), for a while or for good when it failed to release them:
        after the first refusal, the endpoints it still lists and ``endpoints`` (the names
        of the app's containers: a stale endpoint is named after its container, and
        dockerd's inspect may not list it) are dropped by force (the network is the app's
        own and its containers are removed by then), and the removal is retried with
        back-off for up to NETWORK_ENDPOINTS_S.
        """
        deadline = anyio.current_time() + NETWORK_ENDPOINTS_S
        pause = 0.2
        forced = False
        while True:
            try:
                async with self._response(f"networks/{quote(name, safe='')}", method="DELETE"):
                    pass
                return
            except aiodocker.DockerError as e:
                if e.status == 404:
                    return
                if "active endpoints" not in e.message or anyio.current_time() >= deadline:
                    raise _error(e, f"cannot remove network {name!r}") from e
            if not forced:
                forced = True
                await self._drop_stale_endpoints(name, endpoints)
                continue
            await anyio.sleep(pause)
            pause = min(pause * 2, 5.0)

    async def _drop_stale_endpoints(self, name: str, endpoints: Sequence[str]) -> None:
        """Force off the network every endpoint it lists and each of ``endpoints``
        (``network disconnect -f``: for a container the engine no longer has, that
        deletes the endpoint of that name)."""
        try:
            network = await self.client().networks.get(name)
            info = await network.show()
        except aiodocker.DockerError:
            return  # gone meanwhile, or unreadable: the retried removal says which
        listed = [str(e["Name"]) for e in (info.get("Containers") or {}).values()]
        for endpoint in dict.fromkeys([*listed, *endpoints]):
            # An endpoint that cannot be dropped (or was none) makes the retried removal
            # fail, and say so.
            with contextlib.suppress(aiodocker.DockerError):
                await network.disconnect({"Container": endpoint, "Force": True})

    @_translated
    async def network_exists(self, name: str) -> bool:
        try:
            async with self._response(f"networks/{quote(name, safe='')}"):
                return True
        except aiodocker.DockerError as e:
            if e.status == 404:
                return False
            raise _error(e, f"cannot look up network {name!r}", submit=True) from e

    @_translated
    async def list_networks(self, labels: Mapping[str, str]) -> list[dict[str, Any]]:
        filters = json.dumps({"label": [f"{k}={v}" if v else k for k, v in labels.items()]})
        try:
            found: list[dict[str, Any]] = await self.client()._query_json(
                "networks", params={"filters": filters}
            )
        except aiodocker.DockerError as e:
            raise _error(e, "cannot list networks") from e
        return found

    # -------------------------------------------------------------- containers
    @_translated
    async def create(self, name: str, body: Mapping[str, Any]) -> str:
        try:
            container = await self.client().containers.create(dict(body), name=name)
        except aiodocker.DockerError as e:
            if _conflict(e):
                raise SubmitError(
                    f"a container named {name!r} already exists on {self.host}", transient=False
                ) from e
            raise _error(e, f"cannot create container {name!r}", submit=True) from e
        return str(container.id)

    @_translated
    async def start(self, cid: str) -> None:
        try:
            await self.client().containers.container(cid).start()
        except aiodocker.DockerError as e:
            raise _error(e, f"cannot start container {cid[:12]}", submit=True) from e

    @_translated
    async def kill(self, cid: str, signal: str) -> None:
        """Signal a container; one that is gone or not running is not an error."""
        try:
            await self.client().containers.container(cid).kill(signal=signal)
        except aiodocker.DockerError as e:
            if _gone(e) or e.status == 409 or "not running" in e.message or "state" in e.message:
                return
            raise _error(e, f"cannot signal container {cid[:12]}") from e

    @_translated
    async def inspect(self, cid: str) -> dict[str, Any] | None:
        try:
            info: dict[str, Any] = await self.client().containers.container(cid).show()
        except aiodocker.DockerError as e:
            if _gone(e):
                return None
            raise _error(e, f"cannot inspect container {cid[:12]}") from e
        return info

    @_translated
    async def remove(self, cid: str) -> None:
        try:
            await self.client().containers.container(cid).delete(force=True, v=False)
        except aiodocker.DockerError as e:
            if _gone(e):
                return
            if "removal" in e.message and "in progress" in e.message:
                return
            raise _error(e, f"cannot remove container {cid[:12]}") from e

    @_translated
    async def wait_exit(self, cid: str, timeout: float) -> bool:
        """Whether the container is (or within ``timeout`` becomes) not running."""
        try:
            with anyio.move_on_after(timeout):
                async with self._response(
                    f"containers/{cid}/wait", "POST", {"condition": "not-running"}
                ) as response:
                    await response.read()
                    return True
        except aiodocker.DockerError as e:
            if _gone(e):
                return True
            raise _error(e, f"cannot wait for container {cid[:12]}") from e
        return False

    @_translated
    async def list_containers(self, labels: Mapping[str, str]) -> list[dict[str, Any]]:
        filters = json.dumps({"label": [f"{k}={v}" if v else k for k, v in labels.items()]})
        try:
            found: list[dict[str, Any]] = await self.client()._query_json(
                "containers/json", params={"all": "1", "filters": filters}
            )
        except aiodocker.DockerError as e:
            raise _error(e, "cannot list containers") from e
        return found

    # ----------------------------------------------------------------- streams
    @asynccontextmanager
    async def events(
        self, labels: Mapping[str, str], since: float
    ) -> AsyncIterator[AsyncIterator[dict[str, Any]]]:
        """Container events of containers with ``labels``, from ``since`` on, as they happen.

        ``since`` slightly in the past closes the gap between opening the stream
        and the engine subscribing it: replayed events are harmless to callers.
        """
        selectors = [f"{k}={v}" if v else k for k, v in labels.items()]
        params = {
            "filters": json.dumps({"type": ["container"], "label": selectors}),
            "since": f"{since:.9f}",
        }
        try:
            cm = self._response("events", params=params)
            response = await cm.__aenter__()
        except aiodocker.DockerError as e:
            raise _error(e, "cannot follow the engine's events") from e
        except (TimeoutError, aiohttp.ClientError) as e:
            raise BackendError(f"cannot follow the engine's events: {e!r}", transient=True) from e

        async def lines() -> AsyncIterator[dict[str, Any]]:
            try:
                async for raw in response.content:
                    raw = raw.strip()
                    if raw:
                        event = json.loads(raw)
                        if isinstance(event, dict):
                            yield event
            except (TimeoutError, aiohttp.ClientError, ValueError) as e:
                raise BackendError(f"the event stream broke: {e!r}", transient=True) from e
            except RuntimeError as e:
                # aiohttp's reader raises a bare RuntimeError("Connection closed.") when the
                # engine drops the connection between two reads (Podman does, now and then).
                if "Connection closed" not in str(e):
                    raise
                raise BackendError(f"the event stream broke: {e!r}", transient=True) from e

        try:
            yield lines()
        finally:
            await cm.__aexit__(None, None, None)

    async def log_frames(
        self, cid: str, *, follow: bool
    ) -> AsyncIterator[tuple[StreamName, bytes]]:
        """(stream, bytes) as the engine sends them; ends when the engine closes the stream."""
        params = {"stdout": "1", "stderr": "1", "follow": "1" if follow else "0"}
        try:
            async with self._response(f"containers/{cid}/logs", params=params) as response:
                content = response.content
                while True:
                    try:
                        header = await content.readexactly(_FRAME.size)
                    except aiohttp.client_exceptions.ClientPayloadError:
                        return
                    except EOFError:  # asyncio.IncompleteReadError: the stream ended
                        return
                    kind, size = _FRAME.unpack(header)
                    if kind > 2 or header[1:4] != b"\0\0\0":
                        # Podman answers some requests (a container removed meanwhile) with
                        # plain text: never read it as frames (a bogus size, glued bytes).
                        raise BackendError(
                            f"the log stream of container {cid[:12]} is not framed: "
                            f"{header + await content.read(200)!r}",
                            transient=False,
                        )
                    try:
                        data = await content.readexactly(size)
                    except EOFError as e:
                        msg = f"the log stream of container {cid[:12]} ended inside a frame"
                        raise BackendError(msg, transient=True) from e
                    stream = _STREAMS.get(kind)
                    if stream is not None:
                        yield stream, data
        except aiodocker.DockerError as e:
            if _gone(e):
                return
            raise _error(e, f"cannot read the logs of container {cid[:12]}") from e
        except (TimeoutError, aiohttp.ClientError) as e:
            msg = f"the log stream of container {cid[:12]} broke: {e!r}"
            raise BackendError(msg, transient=True) from e


def event_container(event: Mapping[str, Any]) -> str:
    actor = event.get("Actor") or {}
    return str(actor.get("ID") or event.get("id") or "")


def event_action(event: Mapping[str, Any]) -> str:
    return str(event.get("Action") or event.get("status") or "")


def event_time(event: Mapping[str, Any]) -> float | None:
    """When the engine says the event happened, in epoch seconds; None when it does not say.

    Both engines send ``timeNano`` (and ``time``, in whole seconds) with every event.
    """
    for field, scale in (("timeNano", 1e-9), ("time", 1.0)):
        value = event.get(field)
        if isinstance(value, int | float) and not isinstance(value, bool) and value > 0:
            return value * scale
    return None
