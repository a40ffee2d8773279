"""Bringing up (once per test session) the two real engines the docker tests run on.

``scripts/docker-engines`` starts Debian's dockerd and Podman's Docker API on
their own sockets and loads the offline test image into both. Tests skip,
printing why, only when the engines truly cannot start (not root, or
``ASUPERVISOR_DOCKER_ENGINES=skip``).
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import secrets
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "docker-engines"
FACTS = Path("/run/asupervisor-docker.json")
IMAGE = "localhost/sv-test:py"
ENGINES = ("docker", "podman")


def _run(*args: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=timeout, check=False
    )


def _skip(message: str) -> None:
    print(message)
    pytest.skip(message)


def ensure_engines() -> dict[str, Any]:
    """The engines' facts; brings them up when needed."""
    if os.environ.get("ASUPERVISOR_DOCKER_ENGINES") == "skip":
        _skip("ASUPERVISOR_DOCKER_ENGINES=skip: the docker engines are not started")
    if os.geteuid() != 0:
        _skip("not root: scripts/docker-engines cannot install and start dockerd and Podman")
    if _run("status", timeout=60).returncode != 0 or not FACTS.exists():
        done = _run("up")
        if done.returncode != 0:
            _skip(f"the docker engines could not start:\n{done.stdout}\n{done.stderr}")
    facts: dict[str, Any] = json.loads(FACTS.read_text())
    return facts


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str) -> None:
        super().__init__("localhost", timeout=30)
        self._path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(30)
        sock.connect(self._path)
        self.sock = sock


def api(host: str, method: str, path: str, body: Any = None) -> Any:
    """One blocking Engine API call (for test set-up and checks, never inside the library)."""
    conn = _UnixConnection(host.removeprefix("unix://"))
    try:
        if body is None:
            conn.request(method, path)
        else:
            headers = {"Content-Type": "application/json"}
            conn.request(method, path, body=json.dumps(body), headers=headers)
        response = conn.getresponse()
        body = response.read()
    finally:
        conn.close()
    if response.status >= 400:
        raise RuntimeError(f"{method} {path}: {response.status} {body!r}")
    return json.loads(body) if body else None


def labelled(host: str, kind: str, label: str) -> list[dict[str, Any]]:
    """Containers (kind="containers") or networks carrying ``label`` (``key=value``)."""
    filters = quote(json.dumps({"label": [label]}))
    path = (
        f"/containers/json?all=1&filters={filters}"
        if kind == "containers"
        else (f"/networks?filters={filters}")
    )
    found: list[dict[str, Any]] = api(host, "GET", path)
    return found


def leftovers(host: str, session: str) -> list[str]:
    """Names of containers and networks a test session left behind."""
    label = f"io.asupervisor.session={session}"
    names = [str(c["Names"][0]) for c in labelled(host, "containers", label)]
    names += [str(n["Name"]) for n in labelled(host, "networks", label)]
    return names


def remove_leftovers(host: str, session: str) -> None:
    label = f"io.asupervisor.session={session}"
    session_names = []
    for c in labelled(host, "containers", label):
        session_names += [str(name).lstrip("/") for name in c.get("Names") or ()]
        api(host, "DELETE", f"/containers/{c['Id']}?force=1")
    for n in labelled(host, "networks", label):
        # dockerd under load shows removed containers' endpoints for a while.
        deadline = time.monotonic() + 60
        while True:
            try:
                api(host, "DELETE", f"/networks/{n['Id']}")
                break
            except RuntimeError as e:
                if "active endpoints" not in str(e) or time.monotonic() > deadline:
                    raise
            # Endpoints dockerd failed to release stay for good: dropped as the library does,
            # by the names it lists and those of the session's containers (named after them).
            info = api(host, "GET", f"/networks/{n['Id']}")
            listed = [str(e["Name"]) for e in (info.get("Containers") or {}).values()]
            for endpoint in dict.fromkeys([*listed, *session_names]):
                with contextlib.suppress(RuntimeError):
                    body = {"Container": endpoint, "Force": True}
                    api(host, "POST", f"/networks/{n['Id']}/disconnect", body)
            time.sleep(1)


class EngineUnderTest:
    """One engine for one test, with a session of its own so leftovers are attributable."""

    def __init__(self, name: str, host: str, session: str) -> None:
        self.name = name
        self.host = host
        self.session = session

    @property
    def cfg(self) -> dict[str, object]:
        return {"host": self.host, "stop_grace": 2.0}


def engine_under_test(
    request: pytest.FixtureRequest, facts: dict[str, Any]
) -> Iterator[EngineUnderTest]:
    """Body of each module's parametrized ``engine`` fixture: fails the test on leftovers."""
    name = str(request.param)
    info = facts["engines"][name]
    if not info.get("up"):
        _skip(f"the {name} engine did not come up (see /var/log/asupervisor-docker)")
    under_test = EngineUnderTest(name, str(info["host"]), f"t{secrets.token_hex(4)}")
    yield under_test
    left = leftovers(under_test.host, under_test.session)
    remove_leftovers(under_test.host, under_test.session)
    assert not left, f"containers/networks left behind on {name}: {left}"
