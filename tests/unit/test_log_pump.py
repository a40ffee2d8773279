"""The log pump as shipped to Slurm nodes: run from its copy, without the package's dependencies."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from supervisor.backends.slurm.ship import ship_pump


@pytest.fixture
def runner(tmp_path: Path) -> Path:
    path = tmp_path / "app" / ".asupervisor" / "run_pump.py"
    path.parent.mkdir(parents=True)
    ship_pump(path)
    return path


def _pump(runner: Path, log_dir: Path, code: str) -> subprocess.Popen[bytes]:
    # -S and a clean environment: the node has a bare Python, no anyio, no asupervisor.
    return subprocess.Popen(
        [sys.executable, "-S", str(runner), str(log_dir), "--", sys.executable, "-c", code],
        env={"PATH": os.environ["PATH"]},
        stdout=subprocess.DEVNULL,
    )


def test_output_lands_in_the_local_layout_and_the_exit_code_is_kept(
    runner: Path, tmp_path: Path
) -> None:
    logs = tmp_path / "logs"
    code = "import sys; print('out'); sys.stderr.write('err\\n'); sys.stdout.write('tail'); exit(3)"
    proc = _pump(runner, logs, code)
    assert proc.wait(timeout=30) == 3
    assert (logs / "stdout.log").read_bytes() == b"out\ntail"
    assert (logs / "stderr.log").read_bytes() == b"err\n"
    assert sorted((logs / "combined.log").read_bytes().splitlines(keepends=True)) == [
        b"err\n",
        b"out\n",
        b"tail",
    ]
    assert (logs / "timestamps.bin").stat().st_size > 0
    record = json.loads((logs / "exit.json").read_text())
    assert (record["attempt"], record["returncode"]) == (0, 3)  # whose failure, and when
    assert abs(record["ended"] - time.time()) < 60
    # Its start, recorded as it started the command: what a late look at Slurm takes.
    assert json.loads((logs / "start.json").read_text()) == {
        "attempt": 0,
        "started": record["started"],
    }


def test_signals_sent_to_the_pump_alone_are_forwarded_and_a_death_by_signal_is_reproduced(
    runner: Path, tmp_path: Path
) -> None:
    fifo = tmp_path / "ready"
    os.mkfifo(fifo)
    handles_term = (
        "import signal, sys, time\n"
        "signal.signal(signal.SIGTERM, lambda *a: (print('got term', flush=True), sys.exit(7)))\n"
        "print('ready', flush=True)\n"
        f"open({str(fifo)!r}, 'w').close()\n"
        "time.sleep(60)\n"
    )
    logs = tmp_path / "a"
    proc = _pump(runner, logs, handles_term)
    with fifo.open() as ready:  # blocks until the command has set its handler
        ready.read()
    # From another process than the pump's parent (``kill PID`` by hand, say).
    subprocess.run(["kill", "-TERM", str(proc.pid)], check=True)
    assert proc.wait(timeout=30) == 7
    assert (logs / "stdout.log").read_bytes() == b"ready\ngot term\n"
    killed = _pump(
        runner, tmp_path / "b", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"
    )
    assert killed.wait(timeout=30) == -signal.SIGKILL
    assert json.loads((tmp_path / "b" / "exit.json").read_text())["returncode"] == -signal.SIGKILL


def test_a_missing_command_is_reported_in_stderr(runner: Path, tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    proc = subprocess.run(
        [sys.executable, "-S", str(runner), str(logs), "--", "/nonexistent/prog"],
        env={"PATH": os.environ["PATH"]},
        check=False,
        timeout=30,
    )
    assert proc.returncode == 127
    assert b"/nonexistent/prog" in (logs / "stderr.log").read_bytes()


def test_a_signal_the_parent_sends_to_the_whole_step_reaches_the_command_once(
    runner: Path, tmp_path: Path
) -> None:
    """Slurm's step daemon (the pump's parent) signals every process of the step itself:
    forwarding that signal too made a slow TERM handler run twice (the conformance
    cancel test saw "got TERM" twice under a busy CPU). Here the parent signals the
    pump's whole process group, as Slurm's pgid tracking does."""
    fifo = tmp_path / "ready"
    os.mkfifo(fifo)
    slow_handler = (
        "import signal, sys, time\n"
        "def on_term(*a):\n"
        "    print('got term', flush=True)\n"
        "    time.sleep(1.0)  # a second TERM meanwhile would run this again\n"
        "    sys.exit(7)\n"
        "signal.signal(signal.SIGTERM, on_term)\n"
        f"open({str(fifo)!r}, 'w').close()\n"
        "time.sleep(60)\n"
    )
    logs = tmp_path / "a"
    proc = subprocess.Popen(
        [sys.executable, "-S", str(runner), str(logs), "--", sys.executable, "-c", slow_handler],
        env={"PATH": os.environ["PATH"]},
        stdout=subprocess.DEVNULL,
        start_new_session=True,
    )
    with fifo.open() as ready:
        ready.read()
    os.killpg(proc.pid, signal.SIGTERM)
    assert proc.wait(timeout=30) == 7
    assert (logs / "stdout.log").read_bytes() == b"got term\n"
