"""Case 7, docker: submit and wait latency of N containers, against TorchX's local_docker.

Runs against dockerd from ``scripts/docker-engines`` (the engine TorchX's
users run; as root), on the offline image ``localhost/sv-test:py``; fails with
a message when that is not usable. Each repetition launches an app of N
replicas; every replica sleeps until a common deadline, writes the wall clock
into a bind-mounted stamp directory and exits, so all N end in one burst.
Figures per repetition:

* ``submit_s``: from the call to the handle (or the containers) being returned;
* ``latency_s``: from the engine's ``die`` event of the last container (its
  ``timeNano``, read from the engine's event stream by a separate thread) to
  the wait returning: what a supervisor adds to the engine's own news;
* ``stamp_latency_s``: from the latest exit stamp to the wait returning, which
  also counts the interpreter's shutdown and the engine's teardown of the
  container (about 0.1 s on dockerd here, whoever waits).

Implementations (each child first launches one untimed app, so first-use costs
such as imports, the engine connection and TorchX's ``torchx`` network stay
out of the figures):

* ``asupervisor``: ``await sv.submit(app, "docker")`` (network, N containers
  created and started) and ``await sv.wait(handle)``; the cleanup (containers
  and network removed) follows the wait, while the next repetition starts;
* ``torchx``: ``runner.run(app, "local_docker")`` and
  ``runner.wait(handle, wait_interval=1)`` (what ``torchx run`` uses);
* ``docker-py`` (baseline): a loop of ``client.containers.run(detach=True)``
  on one internal network, then ``container.wait()`` for each, one after the
  other (blocking calls; the last exit is what counts);
* ``asupervisor-log-f``: a Supervisor submits the app and closes (the
  containers run on), then ``asupervisor log -f`` in another process follows
  the replica; ``latency_s`` is from the ``die`` event to that process's exit,
  what issue 16 bounds at 1 s (its re-check comes every 30 s). A repetition
  whose follower was not yet following when the container died is an error.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio

from bench.util import (
    Json,
    add_ratios,
    child_parser,
    run_rows,
    scratch,
    summarize,
    write_json,
)

if TYPE_CHECKING:  # imported in the child only, as every case does
    from supervisor import Role

BASELINE = "docker-py"
IMPLS = {
    "asupervisor": "asupervisor `sv.submit(app, 'docker')`, `await sv.wait(h)`",
    "torchx": "TorchX `local_docker`: `runner.run`, `runner.wait(wait_interval=1)`",
    "docker-py": "baseline: docker-py `containers.run(detach=True)` loop, `container.wait()`",
    "asupervisor-log-f": "`asupervisor log -f` of an app whose Supervisor closed",
}
FACTS = Path("/run/asupervisor-docker.json")
IMAGE = "localhost/sv-test:py"
# Sleep to the deadline (microseconds since the epoch), stamp the wall clock, exit.
STAMP = (
    "import os, socket, sys, time;"
    "time.sleep(max(0.0, int(sys.argv[1]) / 1e6 - time.time()));"
    "open('/stamps/' + socket.gethostname() + '-' + str(os.getpid()), 'w').write(repr(time.time()))"
)
FOLLOW_LEAD_S = 5.0
"""``asupervisor-log-f``: from the submit to the exit, time for the Supervisor to close and
the CLI to start following (about 1 s here)."""


def engine_host() -> str:
    try:
        facts = json.loads(FACTS.read_text())
    except (OSError, ValueError) as e:
        raise RuntimeError(f"no docker engines ({e}); run `bash scripts/docker-engines up`") from e
    host = str(facts["engines"]["docker"]["host"])
    if not facts["engines"]["docker"].get("up"):
        raise RuntimeError("dockerd is not up; run `bash scripts/docker-engines up`")
    return host


class _Lead:
    """Seconds between submitting and the replicas' common exit."""

    def __init__(self, n: int) -> None:
        self.seconds = 1.0 + n * 0.15

    def update(self, submit_s: float) -> None:
        self.seconds = max(1.0, 1.5 * submit_s + 1.0)


def _deadline_us(lead: float) -> str:
    return str(int((time.time() + lead) * 1e6))


def _read_stamps(directory: Path, n: int) -> list[float]:
    stamps = [float(p.read_text()) for p in directory.iterdir()]
    if len(stamps) != n:
        raise RuntimeError(f"{len(stamps)} of {n} replicas stamped their exit")
    return stamps


def _sample(done_at: float, stamps: list[float], died_at: float, submit_s: float) -> Json:
    return {
        "latency_s": done_at - died_at,
        "stamp_latency_s": done_at - max(stamps),
        "exit_spread_s": max(stamps) - min(stamps),
        "submit_s": submit_s,
    }


def _stamping_role(stamps: Path, n: int, lead_s: float, first: str = "") -> Role:
    """N replicas that run ``first``, then ``STAMP`` into ``stamps`` (made here) at the
    deadline ``lead_s`` from now."""
    from supervisor import BindMount, Role

    stamps.mkdir()
    return Role(
        name="r",
        image=IMAGE,
        entrypoint="python3",
        args=["-c", first + STAMP, _deadline_us(lead_s)],
        num_replicas=n,
        mounts=[BindMount(str(stamps), "/stamps")],
    )


class DieClock:
    """When the engine says each labelled container died, from its event stream (a thread).

    ``label`` is a label key; ``died(value)`` is the latest ``die`` of the
    containers whose label has that value.
    """

    def __init__(self, label: str) -> None:
        import docker

        self.label = label
        self._client = docker.DockerClient(base_url=engine_host())
        self._stream = self._client.events(
            decode=True, filters={"type": "container", "event": "die", "label": label}
        )
        self._times: dict[str, list[float]] = {}
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        with contextlib.suppress(Exception):  # the stream is closed under it at the end
            for event in self._stream:
                value = (event.get("Actor") or {}).get("Attributes", {}).get(self.label, "")
                with self._lock:
                    self._times.setdefault(value, []).append(event["timeNano"] / 1e9)

    def died(self, value: str, count: int, timeout: float = 10.0) -> float:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                times = list(self._times.get(value, []))
            if len(times) >= count:
                return max(times)
            time.sleep(0.01)  # the bench's own bookkeeping, after the measurement
        raise RuntimeError(f"saw {len(times)} of {count} die events for {value}")

    def close(self) -> None:
        self._stream.close()
        self._client.close()


async def _asupervisor(n: int, reps: int, tmp: Path) -> list[Json]:
    from supervisor import AppDef, Supervisor

    cfg = {"host": engine_host()}
    lead = _Lead(n)
    out: list[Json] = []
    clock = DieClock("io.asupervisor.app_id")
    async with Supervisor(session=f"bench{secrets.token_hex(3)}", state_dir=tmp / "state") as sv:
        for rep in range(-1, reps):
            stamps = tmp / f"stamps-{rep}"
            role = _stamping_role(stamps, n if rep >= 0 else 1, lead.seconds)
            started = time.perf_counter()
            handle = await sv.submit(AppDef(name="wait", roles=[role]), "docker", cfg)
            submit_s = time.perf_counter() - started
            status = await sv.wait(handle)
            done_at = time.time()
            if status.state.name != "SUCCEEDED":
                raise RuntimeError(f"app ended {status.state.name}: {status.msg}")
            if rep >= 0:
                died = clock.died(handle.rsplit("/", 1)[1], n)
                out.append(_sample(done_at, _read_stamps(stamps, n), died, submit_s))
                lead.update(submit_s)
    clock.close()
    return out


async def _cli_follower(n: int, reps: int, tmp: Path) -> list[Json]:
    """``asupervisor log -f`` of an app whose Supervisor closed: ``die`` -> its exit."""
    import subprocess
    import sys

    from supervisor import AppDef, Supervisor

    host = engine_host()
    state = tmp / "state"
    session = f"bench{secrets.token_hex(3)}"
    out: list[Json] = []
    clock = DieClock("io.asupervisor.app_id")
    for rep in range(-1, reps):
        stamps = tmp / f"stamps-{rep}"
        role = _stamping_role(stamps, n, FOLLOW_LEAD_S, first="print('started', flush=True);")
        started = time.perf_counter()
        async with Supervisor(session=session, state_dir=state) as sv:
            handle = await sv.submit(AppDef(name="follow", roles=[role]), "docker", {"host": host})
        submit_s = time.perf_counter() - started
        argv = [sys.executable, "-m", "supervisor.cli.main", "--state-dir", str(state)]
        argv += ["log", "-f", handle, "r/0"]
        env = {**os.environ, "DOCKER_HOST": host}
        async with await anyio.open_process(argv, env=env, stderr=subprocess.DEVNULL) as cli:
            assert cli.stdout is not None
            first = await cli.stdout.receive()
            following_at = time.time()
            async for _ in cli.stdout:
                pass
            code = await cli.wait()
        done_at = time.time()
        if not first.startswith(b"started") or code != 0:
            raise RuntimeError(f"log -f printed {first!r} and exited {code}")
        died = clock.died(handle.rsplit("/", 1)[1], n)
        if following_at >= died:
            raise RuntimeError("the follower started after the app ended: raise FOLLOW_LEAD_S")
        if rep >= 0:
            out.append(_sample(done_at, _read_stamps(stamps, n), died, submit_s))
    clock.close()
    return out


def _torchx(n: int, reps: int, tmp: Path) -> list[Json]:
    from torchx import specs
    from torchx.runner import get_runner

    from bench.torchx_util import quiet_torchx

    os.environ["DOCKER_HOST"] = engine_host()
    quiet_torchx()
    lead = _Lead(n)
    out: list[Json] = []
    runner = get_runner()
    clock = DieClock("torchx.pytorch.org/app-id")
    try:
        for rep in range(-1, reps):
            stamps = tmp / f"stamps-{rep}"
            stamps.mkdir()
            role = specs.Role(
                name="r",
                image=IMAGE,
                entrypoint="python3",
                args=["-c", STAMP, _deadline_us(lead.seconds)],
                num_replicas=n if rep >= 0 else 1,
                mounts=[specs.BindMount(str(stamps), "/stamps")],
            )
            started = time.perf_counter()
            handle = runner.run(specs.AppDef(name="wait", roles=[role]), "local_docker")
            submit_s = time.perf_counter() - started
            status = runner.wait(handle, wait_interval=1)
            done_at = time.time()
            if status is None or status.state.name != "SUCCEEDED":
                raise RuntimeError(f"app ended {status}")
            if rep >= 0:
                died = clock.died(handle.rsplit("/", 1)[1], n)
                out.append(_sample(done_at, _read_stamps(stamps, n), died, submit_s))
                lead.update(submit_s)
    finally:
        clock.close()
        _remove_torchx_containers()
        runner.close()
    return out


def _remove_torchx_containers() -> None:
    import docker

    client = docker.DockerClient(base_url=engine_host())
    try:
        for c in client.containers.list(all=True, filters={"label": "torchx.pytorch.org/version"}):
            c.remove(force=True)
    finally:
        client.close()


def _docker_py(n: int, reps: int, tmp: Path) -> list[Json]:
    import docker

    client = docker.DockerClient(base_url=engine_host())
    network = client.networks.create(f"asv-bench-{secrets.token_hex(3)}", internal=True)
    lead = _Lead(n)
    out: list[Json] = []
    clock = DieClock("asv-bench-rep")
    try:
        for rep in range(-1, reps):
            stamps = tmp / f"stamps-{rep}"
            stamps.mkdir()
            count = n if rep >= 0 else 1
            argv = ["python3", "-c", STAMP, _deadline_us(lead.seconds)]
            started = time.perf_counter()
            containers = [
                client.containers.run(
                    IMAGE,
                    argv,
                    detach=True,
                    network=network.name,
                    init=True,
                    labels={"asv-bench-rep": f"{network.name}-{rep}"},
                    volumes={str(stamps): {"bind": "/stamps", "mode": "rw"}},
                )
                for _ in range(count)
            ]
            submit_s = time.perf_counter() - started
            for c in containers:
                c.wait()
            done_at = time.time()
            for c in containers:
                c.remove(force=True)
            if rep >= 0:
                died = clock.died(f"{network.name}-{rep}", n)
                out.append(_sample(done_at, _read_stamps(stamps, n), died, submit_s))
                lead.update(submit_s)
    finally:
        clock.close()
        network.remove()
        client.close()
    return out


def child() -> None:
    parser = child_parser(__doc__ or "")
    args = parser.parse_args()
    with scratch() as tmp:
        samples: list[Json]
        if args.impl == "asupervisor":
            samples = anyio.run(_asupervisor, args.n, args.reps, tmp)
        elif args.impl == "torchx":
            samples = _torchx(args.n, args.reps, tmp)
        elif args.impl == "docker-py":
            samples = _docker_py(args.n, args.reps, tmp)
        elif args.impl == "asupervisor-log-f":
            samples = anyio.run(_cli_follower, args.n, args.reps, tmp)
        else:
            parser.error(f"unknown --impl {args.impl}")
    write_json(args.out, {"samples": samples})


def _fill(row: Json, result: Json, n: int) -> None:
    samples = result["samples"]
    row["stats"] = summarize([s["latency_s"] for s in samples])
    row["stamp_latency"] = summarize([s["stamp_latency_s"] for s in samples])
    row["submit"] = summarize([s["submit_s"] for s in samples])
    row["exit_spread"] = summarize([s["exit_spread_s"] for s in samples])


def run_case(plan: dict[str, Any]) -> Json:
    """Every (implementation, N) of ``plan["runs"]`` in its own child process."""
    engine_host()  # fail early, saying why
    rows = run_rows("case_docker", plan, _fill)
    add_ratios(rows, BASELINE)
    add_ratios(rows, BASELINE, stat="submit")
    return {
        "title": "docker: submit N containers, and last exit -> wait() returns",
        "unit": "s",
        "baseline": BASELINE,
        "impls": IMPLS,
        "rows": rows,
    }


if __name__ == "__main__":
    child()
