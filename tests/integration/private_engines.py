"""Private Docker-API engines a fault test starts, breaks (freeze, kill, restart) and removes.

Never the shared engines of ``scripts/docker-engines``: a test that stops an
engine starts its own. A private Podman API (``podman system service`` on a
socket of its own) is cheap and shares Podman's storage, so the test image is
already there. A private dockerd has its own data root, exec root, pid file,
socket and no bridge or iptables rules of its own (apps bring their own
internal networks, from address pools room for 256 of them); the test image is
copied in from the shared dockerd.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from .docker_engines import IMAGE, labelled, remove_leftovers

__all__ = ["PrivateEngine", "private_dockerd", "private_podman"]


class PrivateEngine:
    """One engine process this test owns: ``freeze``, ``thaw``, ``kill``, ``start`` again."""

    def __init__(self, name: str, argv: list[str], socket: Path, log: Path) -> None:
        self.name = name
        self.argv = argv
        self.socket = socket
        self.log = log
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def host(self) -> str:
        return f"unix://{self.socket}"

    def start(self, timeout: float = 90.0) -> None:
        self.socket.unlink(missing_ok=True)
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                self.argv, stdin=subprocess.DEVNULL, stdout=out, stderr=out, start_new_session=True
            )
        deadline = time.monotonic() + timeout
        while True:
            if self.answers():
                return
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"private {self.name} did not come up: {self.log.read_text()}")
            time.sleep(0.2)

    def answers(self) -> bool:
        """GET /_ping answers 200 (blocking; test set-up only)."""
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(5)
            try:
                sock.connect(str(self.socket))
                sock.sendall(b"GET /_ping HTTP/1.0\r\nHost: x\r\n\r\n")
                return b" 200 " in sock.recv(64)
            except OSError:
                return False

    def signal(self, sig: int) -> None:
        assert self.proc is not None
        os.killpg(self.proc.pid, sig)

    def freeze(self) -> None:
        self.signal(signal.SIGSTOP)

    def thaw(self) -> None:
        self.signal(signal.SIGCONT)

    def kill(self) -> None:
        """SIGKILL the engine (its containers live on under their shims)."""
        if self.proc is None:
            return
        self.proc.send_signal(signal.SIGCONT)
        self.proc.kill()
        self.proc.wait(30)
        self.proc = None

    def terminate(self, timeout: float = 60.0) -> None:
        """SIGTERM, as an init system's restart does (dockerd stops its containers)."""
        if self.proc is None:
            return
        self.proc.send_signal(signal.SIGCONT)
        self.proc.terminate()
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(30)
        self.proc = None


def _cleanup(engine: PrivateEngine, session: str) -> None:
    if engine.proc is None:
        engine.start()
    else:
        engine.thaw()
    try:
        remove_leftovers(engine.host, session)
    finally:
        engine.terminate()


@contextmanager
def private_podman(session: str) -> Iterator[PrivateEngine]:
    """A private Podman API on its own socket; on the way out its session's containers go."""
    tmp = Path(tempfile.mkdtemp(prefix="sv-podman-"))
    sock = tmp / "podman.sock"
    engine = PrivateEngine(
        "podman", ["podman", "system", "service", "--time=0", f"unix://{sock}"], sock, tmp / "log"
    )
    engine.start()
    try:
        yield engine
    finally:
        try:
            _cleanup(engine, session)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)


@contextmanager
def private_dockerd(
    session: str, shared_host: str, address_pool: str = "base=10.213.0.0/16,size=24"
) -> Iterator[PrivateEngine]:
    """A private dockerd (own roots, socket, pid file; no bridge, no iptables), test image in.

    ``address_pool`` is its ``--default-address-pool``: by default room for 256 networks
    (dockerd's own default pools hold 31), one per app."""
    tmp = Path(tempfile.mkdtemp(prefix="sv-dockerd-", dir="/var/tmp"))
    run = Path(tempfile.mkdtemp(prefix="sv-dockerd-", dir="/run"))
    sock = run / "docker.sock"
    argv = [
        "dockerd",
        f"--host=unix://{sock}",
        f"--pidfile={run / 'docker.pid'}",
        f"--data-root={tmp / 'data'}",
        f"--exec-root={run / 'exec'}",
        "--bridge=none",
        "--iptables=false",
        "--ip-forward=false",
        "--ip-masq=false",
        f"--default-address-pool={address_pool}",
        f"--containerd-namespace=sv{os.getpid()}",
        f"--containerd-plugins-namespace=sv{os.getpid()}p",
    ]
    engine = PrivateEngine("dockerd", argv, sock, tmp / "log")
    engine.start()
    try:
        env = {**os.environ}
        save = subprocess.Popen(
            ["docker", "-H", shared_host, "save", IMAGE], stdout=subprocess.PIPE, env=env
        )
        subprocess.run(
            ["docker", "-H", engine.host, "load"],
            stdin=save.stdout,
            check=True,
            capture_output=True,
            env=env,
            timeout=300,
        )
        save.wait(60)
        assert save.stdout is not None
        save.stdout.close()
        yield engine
    finally:
        try:
            _cleanup(engine, session)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
            shutil.rmtree(run, ignore_errors=True)


def containers(engine: PrivateEngine, session: str) -> list[dict[str, Any]]:
    return labelled(engine.host, "containers", f"io.asupervisor.session={session}")
