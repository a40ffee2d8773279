"""The CLI end to end: real ``asupervisor`` processes against one state directory.

Every command runs as ``python -m supervisor.cli.main`` in its own process,
so apps launched by one are followed, logged and cancelled from others.
"""

from __future__ import annotations

import json
import os
import pty
import select
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
CLI = [sys.executable, "-m", "supervisor.cli.main"]
# Started as from a shell, whatever this process ignores (a CI runner under nohup
# ignores SIGHUP, and an ignored signal stays ignored across exec).
AS_FROM_A_SHELL = [
    sys.executable,
    "-c",
    "import os, signal, sys\n"
    "signal.signal(signal.SIGHUP, signal.SIG_DFL)\n"
    "signal.signal(signal.SIGINT, signal.default_int_handler)\n"
    "os.execv(sys.executable, [sys.executable, '-m', 'supervisor.cli.main', *sys.argv[1:]])",
]
TIMEOUT = 30.0


@pytest.fixture
def env(state_dir: Path) -> dict[str, str]:
    return {
        **os.environ,
        "ASUPERVISOR_HOME": str(state_dir),
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }


def cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, *args], env=env, capture_output=True, text=True, timeout=TIMEOUT, check=False
    )


# status and describe exit as ``run --wait`` does once the app ended (supervisor.cli.codes).
STATE_CODES = {"FAILED": 1, "CANCELLED": 3, "UNKNOWN": 4}


def cli_json(env: dict[str, str], *args: str) -> Any:
    """``args --json``, parsed; for status/describe the exit code must follow the state."""
    done = cli(env, *args, "--json")
    found = json.loads(done.stdout)
    by_state = args[0] in ("status", "describe") and isinstance(found, dict)
    expected = STATE_CODES.get(found["state"], 0) if by_state else 0
    assert done.returncode == expected, done.stderr
    if expected:  # one line, naming the app and its state
        assert done.stderr.startswith(f"Error: {found['handle']} {found['state']}"), done.stderr
        assert done.stderr.count("\n") == 1, done.stderr
    return found


class Background:
    """A CLI process whose stdout is read line by line, each read bounded by a deadline."""

    def __init__(self, env: dict[str, str], args: list[str], stderr: Path) -> None:
        self._stderr = stderr.open("w")
        self.proc = subprocess.Popen(
            [*AS_FROM_A_SHELL, *args], env=env, stdout=subprocess.PIPE, stderr=self._stderr
        )
        self.stderr_path = stderr
        self._buffer = b""

    def read_line(self, timeout: float = TIMEOUT) -> str:
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        deadline = time.monotonic() + timeout
        while b"\n" not in self._buffer:
            left = deadline - time.monotonic()
            readable, _, _ = select.select([fd], [], [], max(left, 0))
            if not readable:
                raise AssertionError(f"no line within {timeout} s; got {self._buffer!r}")
            chunk = os.read(fd, 65536)
            if not chunk:
                raise AssertionError(f"stdout closed; got {self._buffer!r}; {self.stderr()}")
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line.decode()

    def wait(self, timeout: float = TIMEOUT) -> int:
        return self.proc.wait(timeout)

    def rest(self) -> str:
        assert self.proc.stdout is not None
        return (self._buffer + self.proc.stdout.read()).decode()

    def stderr(self) -> str:
        self._stderr.flush()
        return self.stderr_path.read_text()

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(TIMEOUT)
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self._stderr.close()


@pytest.fixture
def background(env: dict[str, str], tmp_path: Path) -> Iterator[Any]:
    started: list[Background] = []

    def start(*args: str) -> Background:
        bg = Background(env, list(args), tmp_path / f"stderr-{len(started)}.txt")
        started.append(bg)
        return bg

    yield start
    for bg in started:
        bg.close()


def wait_for_state(env: dict[str, str], handle: str, state: str) -> dict[str, Any]:
    """``status --json`` until it reports ``state``; the other process writes it asynchronously."""
    deadline = time.monotonic() + TIMEOUT
    while True:
        found: dict[str, Any] = cli_json(env, "status", handle)
        if found["state"] == state or time.monotonic() > deadline:
            assert found["state"] == state, found
            return found


# ------------------------------------------------------------------------ run
def test_run_wait_succeeds_and_prints_transitions(env: dict[str, str]) -> None:
    done = cli(env, "run", "--wait", "--", "sh", "-c", "echo hi; exit 0")
    assert done.returncode == 0, done.stderr
    handle = done.stdout.splitlines()[0]
    assert handle.startswith("local://") and "/sh-" in handle
    assert "SUCCEEDED" in done.stdout
    assert "sh/0  RUNNING -> SUCCEEDED" in done.stderr
    assert "app  RUNNING -> SUCCEEDED" in done.stderr
    assert "app  UNSUBMITTED -> SUBMITTED" in done.stderr


def test_a_failing_command_exits_1_with_its_status_as_json(env: dict[str, str]) -> None:
    done = cli(env, "run", "--wait", "--json", "--", "sh", "-c", "echo bad >&2; exit 3")
    assert done.returncode == 1, done.stderr
    first, final = (json.loads(line) for line in done.stdout.splitlines())
    assert first["handle"].startswith("local://")
    assert final["handle"] == first["handle"] and final["state"] == "FAILED"
    (replica,) = final["roles"][0]["replicas"]
    assert replica["exit_code"] == 3 and replica["state"] == "FAILED"
    assert "RUNNING -> FAILED" in done.stderr


ERROR_FILE_WRITER = """
import json, os, sys
json.dump({"message": {"message": "RuntimeError: rank 0 diverged", "errorCode": 7,
    "extraInfo": {"py_callstack": "Traceback (most recent call last):\\n  File train.py\\n",
                  "timestamp": "1700000000"}}}, open(os.environ["TORCHELASTIC_ERROR_FILE"], "w"))
sys.exit(1)
"""


def test_status_shows_a_structured_error_formatted_not_as_raw_json(env: dict[str, str]) -> None:
    done = cli(env, "run", "--wait", "--", sys.executable, "-c", ERROR_FILE_WRITER)
    assert done.returncode == 1, done.stderr
    handle = done.stdout.splitlines()[0]
    shown = cli(env, "status", handle)
    assert shown.returncode == 1
    # One line on stderr: the app, its state and the root cause's headline.
    assert shown.stderr == f"Error: {handle} FAILED: RuntimeError: rank 0 diverged\n"
    out = shown.stdout
    assert "error: RuntimeError: rank 0 diverged (code 7, 2023-11-14T22:13:20+00:00)" in out
    assert "  Traceback (most recent call last):" in out
    assert '{"message"' not in out  # the table cell has the headline, not the JSON
    raw = cli_json(env, "status", handle)["structured_error_msg"]
    assert json.loads(raw)["message"]["errorCode"] == 7  # JSON output keeps it whole


@pytest.mark.parametrize("wait", [[], ["--wait"]], ids=["quiet", "wait"])
def test_a_missing_program_fails_with_one_line_on_stderr(
    env: dict[str, str], tmp_path: Path, wait: list[str]
) -> None:
    program = tmp_path / "no-such-program"
    done = cli(env, "run", *wait, "--", str(program))
    assert done.returncode == 1
    handle = done.stdout.splitlines()[0]
    cause = (
        f"no-such-program/0 exited with code 127: cannot start '{program}': "
        "No such file or directory"
    )
    errors = [line for line in done.stderr.splitlines() if line.startswith("Error:")]
    assert errors == [f"Error: {handle} FAILED: {cause}"], done.stderr
    assert done.stderr.endswith(errors[0] + "\n")  # the last line, after any transitions
    if not wait:
        assert done.stderr == errors[0] + "\n"
    else:
        assert "FAILED" in done.stdout
    assert "(No such file or directory)" not in done.stdout + done.stderr  # said once


def test_run_without_wait_prints_only_the_handle_and_stays_to_the_end(
    env: dict[str, str],
) -> None:
    done = cli(env, "run", "--", "sh", "-c", "echo quiet")
    assert done.returncode == 0, done.stderr
    (handle,) = done.stdout.splitlines()
    assert done.stderr == ""
    assert cli_json(env, "status", handle)["state"] == "SUCCEEDED"


def closed(env: dict[str, str], fd: str, *args: str) -> subprocess.CompletedProcess[str]:
    """``asupervisor ARGS`` with descriptor ``fd`` closed (``2>&-``), as a shell leaves it."""
    return subprocess.run(
        ["sh", "-c", f'exec "$@" {fd}>&-', "sh", *CLI, *args],
        env=env, capture_output=True, text=True, timeout=TIMEOUT, check=False,
    )  # fmt: skip


def test_run_with_stderr_closed_runs_its_app_to_the_end(env: dict[str, str]) -> None:
    """Python makes a stream closed at start None: `run` cancelled its app at once ("the
    supervisor closed", exit 1) and `run --wait` failed on ``None.isatty()``."""
    done = closed(env, "2", "run", "--", "sh", "-c", "sleep 1; exit 0")
    assert done.returncode == 0, done.stderr
    (handle,) = done.stdout.splitlines()
    assert cli_json(env, "status", handle)["state"] == "SUCCEEDED"
    # Exit codes as ever: 1 for a FAILED app, its status still on stdout.
    done = closed(env, "2", "run", "--wait", "--", "sh", "-c", "exit 3")
    assert done.returncode == 1, done.stderr
    handle = done.stdout.splitlines()[0]
    assert "FAILED" in done.stdout
    assert cli_json(env, "status", handle)["state"] == "FAILED"


@pytest.mark.parametrize(
    "args",
    [["run", "--wait", "--", "true"], ["run", "--log", "--", "echo", "hi"], ["list"]],
    ids=["run-wait", "run-log", "list"],
)
def test_a_command_with_stdout_closed_writes_nowhere_and_exits_as_usual(
    env: dict[str, str], args: list[str]
) -> None:
    if args[0] == "list":
        assert cli(env, "run", "--", "true").returncode == 0
    done = closed(env, "1", *args)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr and "Error" not in done.stderr, done.stderr
    (latest,) = cli_json(env, "list")[:1]
    assert latest["state"] == "SUCCEEDED", latest


def test_a_broken_install_explained_with_stderr_closed_writes_nothing_to_stdout(
    env: dict[str, str], tmp_path: Path
) -> None:
    """The explanation of a ``supervisor`` package that is not ours (here: its
    ``__init__.py`` deleted, as uninstalling supervisord does) went to stdout when stderr
    was closed at start: ``print(file=None)`` writes to stdout, into what a script reads."""
    package = tmp_path / "supervisor"
    (package / "cli").mkdir(parents=True)
    for name in ("__main__.py", "clash.py", "cli/__init__.py"):
        shutil.copy(ROOT / "supervisor" / name, package / name)
    bare = {**env, "PYTHONPATH": str(tmp_path)}

    def broken(redirect: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["sh", "-c", f'exec "$@" {redirect}', "sh", sys.executable, "-m", "supervisor",
             "list"],
            env=bare, cwd=tmp_path, capture_output=True, text=True, timeout=TIMEOUT, check=False,
        )  # fmt: skip

    told = broken("")
    assert told.returncode == 1 and told.stdout == "", told
    assert told.stderr.startswith("asupervisor: asupervisor is broken: "), told.stderr
    assert "__init__.py is missing" in told.stderr
    quiet = broken("2>&-")
    assert quiet.returncode == 1, quiet
    assert quiet.stdout == "" and quiet.stderr == "", quiet


def test_log_of_an_app_whose_record_is_damaged_says_why(
    env: dict[str, str], state_dir: Path
) -> None:
    """Its app.json cut short (a crash mid-write): `log` printed nothing and exited 0, and
    `log H echo/0` said "no role 'echo'"."""
    done = cli(env, "--session", "d", "run", "--", "echo", "hello")
    assert done.returncode == 0, done.stderr
    handle = done.stdout.strip()
    record = state_dir / "logs" / "d" / handle.rpartition("/")[2] / "app.json"
    record.write_bytes(record.read_bytes()[:30])
    for args in ((), ("echo/0",)):
        result = cli(env, "log", handle, *args)
        assert result.returncode == 1, (args, result.stderr)
        assert result.stderr.startswith(f"Error: cannot tell the replicas of {handle}: ")
        assert f"damaged record: {record}" in result.stderr and result.stdout == ""


def test_run_log_prefixes_every_replica(env: dict[str, str]) -> None:
    done = cli(
        env, "run", "--wait", "--log", "sh", "--num_replicas", "2",
        "echo hello ${replica_id}; echo oops ${replica_id} >&2",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    for k in (0, 1):
        assert f"sh/{k} | hello {k}" in lines
        assert f"sh/{k} | oops {k}" in lines
    assert lines.index("sh/0 | hello 0") < next(
        i for i, line in enumerate(lines) if "SUCCEEDED" in line
    )  # logs drained before the final table


def test_log_filters(env: dict[str, str]) -> None:
    done = cli(
        env, "run", "sh", "--num_replicas", "2",
        "echo out ${replica_id}; echo err ${replica_id} >&2; printf 'no newline'",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    handle = done.stdout.strip()

    def log_of(*args: str) -> str:
        result = cli(env, "log", *args)
        assert result.returncode == 0, result.stderr
        return result.stdout

    def log(*args: str) -> str:
        return log_of(handle, *args)

    everything = log().splitlines()
    for k in (0, 1):
        mine = [line for line in everything if line.startswith(f"sh/{k} | ")]
        assert sorted(mine) == sorted(
            f"sh/{k} | {text}" for text in (f"out {k}", f"err {k}", "no newline")
        )
    assert everything.index("sh/0 | no newline") < everything.index("sh/1 | out 1")
    assert log("sh/1", "--streams", "stderr") == "err 1\n"
    assert log("sh/0", "--streams", "stdout") == "out 0\nno newline"  # printed as written
    assert log("sh", "--regex", "^out") == "sh/0 | out 0\nsh/1 | out 1\n"
    assert log("sh/0", "--since", "1h", "--streams", "stderr") == "err 0\n"
    assert log("sh/0", "--until", "1") == ""
    records = [
        json.loads(line) for line in log("sh/1", "--json", "--streams", "stdout").splitlines()
    ]
    assert records == [
        {"role": "sh", "replica_id": 1, "line": "out 1"},
        {"role": "sh", "replica_id": 1, "line": "no newline"},
    ]
    bad = cli(env, "log", handle, "sh/7")
    assert bad.returncode == 2 and "no 7" in bad.stderr
    # TorchX's HANDLE/ROLE[/K] in one argument.
    assert log_of(f"{handle}/sh/1", "--streams", "stderr") == "err 1\n"
    assert log_of(f"{handle}/sh", "--regex", "^out") == "sh/0 | out 0\nsh/1 | out 1\n"
    bad = cli(env, "log", f"{handle}/nope/0")
    assert bad.returncode == 2 and "no role 'nope'" in bad.stderr
    missing = cli(env, "log", f"{handle}x/sh/0")
    assert missing.returncode == 1 and f"no app {handle}x/sh/0" in missing.stderr


def test_log_json_gives_each_line_without_its_ending(env: dict[str, str]) -> None:
    """Each record's "line" kept the ``\\n`` (or ``\\r\\n``) that ended it, where the text
    output shows one line per line; whatever else the line holds stays, a lone or inner
    ``\\r`` too."""
    script = r"printf 'one\ntwo\r\nbar\rfoo\n  spaced  \n\n\tlast\r'"
    done = cli(env, "run", "--", "sh", "-c", script)
    assert done.returncode == 0, done.stderr
    handle = done.stdout.strip()
    shown = cli(env, "log", handle, "--json")
    assert shown.returncode == 0, shown.stderr
    lines = [json.loads(record)["line"] for record in shown.stdout.splitlines()]
    assert lines == ["one", "two", "bar\rfoo", "  spaced  ", "", "\tlast\r"]
    # The text output, as written (a newline after the last line), one line per record;
    # bytes, as text mode would read each \\r as a newline.
    text = subprocess.run(
        [*CLI, "log", handle], env=env, capture_output=True, timeout=TIMEOUT, check=True
    ).stdout
    assert text == b"".join(
        b"sh/0 | " + line + b"\n"
        for line in (b"one", b"two\r", b"bar\rfoo", b"  spaced  ", b"", b"\tlast\r")
    )


# ------------------------------------------------------ a second process
def test_another_process_follows_and_cancels_a_run(env: dict[str, str], background: Any) -> None:
    run = background("run", "--wait", "--", "sh", "-c", "echo started; exec sleep 30")
    handle = run.read_line()
    assert handle.startswith("local://")

    follower = background("log", "-f", handle, "sh/0")
    assert follower.read_line() == "started"

    status = wait_for_state(env, handle, "RUNNING")
    (replica,) = status["roles"][0]["replicas"]
    assert replica["state"] == "RUNNING" and replica["hostname"]

    listed = cli_json(env, "list")
    assert {"handle": handle, "state": "RUNNING"}.items() <= next(
        a for a in listed if a["handle"] == handle
    ).items()

    described = cli_json(env, "describe", handle)
    assert described["roles"][0]["entrypoint"] == "sh"
    assert described["roles"][0]["args"] == ["-c", "echo started; exec sleep 30"]

    human = cli(env, "status", handle)
    assert human.returncode == 0 and "RUNNING" in human.stdout and "sh" in human.stdout

    cancelled = cli(env, "cancel", handle)
    assert cancelled.returncode == 0, cancelled.stderr
    assert run.wait() == 3, run.stderr()
    assert "RUNNING -> CANCELLED" in run.stderr()
    assert "CANCELLED" in run.rest()
    assert follower.wait() == 0  # a follower ends with the app

    final = cli_json(env, "status", handle)
    assert final["state"] == "CANCELLED"
    assert final["roles"][0]["replicas"][0]["state"] == "CANCELLED"
    again = cli(env, "cancel", handle)
    assert again.returncode == 0 and "already ended" in again.stderr
    assert "sh/0 | started\n" in cli(env, "log", handle).stdout


def test_log_follow_ends_soon_after_the_owner_is_killed(
    env: dict[str, str], background: Any
) -> None:
    run = background("run", "--wait", "--", "sh", "-c", "echo started; exec sleep 30")
    handle = run.read_line()
    follower = background("log", "-f", handle, "sh/0")
    assert follower.read_line() == "started"
    run.proc.send_signal(signal.SIGKILL)
    # Far below the followers' 30 s re-check: the owner's exit itself ends the follow.
    assert follower.wait(timeout=15) == 0, follower.stderr()
    final = cli_json(env, "status", handle)
    assert final["state"] == "UNKNOWN"
    assert final["roles"][0]["replicas"][0]["state"] == "UNKNOWN"
    # A cancel says what the app is and why, not only "cancel requested".
    cancelled = cli(env, "cancel", handle)
    assert cancelled.returncode == 0, cancelled.stderr
    assert cancelled.stderr == f"cancel requested: {handle} (UNKNOWN: {final['msg']})\n"


@pytest.mark.parametrize(
    ("signum", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143), (signal.SIGHUP, 129)]
)
def test_a_signal_cancels_the_app_before_exiting(
    env: dict[str, str], background: Any, signum: int, code: int
) -> None:
    run = background("run", "--wait", "--", "sleep", "30")
    handle = run.read_line()
    run.proc.send_signal(signum)
    assert run.wait() == code, run.stderr()
    name = signal.Signals(signum).name
    assert f"{name}: cancelling {handle}" in run.stderr()
    # The documented last line: every non-zero code but 141 comes with one.
    last = run.stderr().splitlines()[-1]
    assert last == f"Error: {name}: {handle} CANCELLED: cancelled by request", run.stderr()
    final = cli_json(env, "status", handle)
    assert final["state"] == "CANCELLED"
    assert final["roles"][0]["replicas"][0]["state"] == "CANCELLED"


def test_ctrl_c_on_a_log_follow_says_so_and_leaves_the_app(
    env: dict[str, str], background: Any
) -> None:
    run = background("run", "--", "sh", "-c", "echo started; exec sleep 30")
    handle = run.read_line()
    follower = background("log", "-f", handle, "sh/0")
    assert follower.read_line() == "started"
    follower.proc.send_signal(signal.SIGINT)
    assert follower.wait() == 130, follower.stderr()
    assert follower.stderr().splitlines()[-1:] == ["Error: interrupted (SIGINT)"]
    assert cli_json(env, "status", handle)["state"] == "RUNNING"
    run.proc.send_signal(signal.SIGTERM)
    assert run.wait() == 143


def test_ctrl_c_while_a_component_loads_says_so(
    env: dict[str, str], background: Any, tmp_path: Path
) -> None:
    """Before any app exists: click said "Aborted!" and exited 1, which reads as FAILED."""
    component = tmp_path / "slow.py"
    component.write_text(
        "import time\n"
        "print('loading', flush=True)\n"
        "time.sleep(30)\n"
        "def slow():\n"
        "    raise AssertionError('never called')\n"
    )
    run = background("run", "--wait", f"{component}:slow")
    assert run.read_line() == "loading"
    run.proc.send_signal(signal.SIGINT)
    assert run.wait() == 130, run.stderr()
    assert run.stderr().splitlines()[-1:] == ["Error: interrupted (SIGINT)"]


def test_runopts_local_lists_log_dir(env: dict[str, str]) -> None:
    done = cli(env, "runopts", "local")
    assert done.returncode == 0
    assert "log_dir" in done.stdout


# ------------------------------------------------------------ habits (issue 18)
def test_status_and_describe_exit_as_run_wait_does(env: dict[str, str]) -> None:
    ok = cli(env, "run", "--", "true").stdout.strip()
    failed = cli(env, "run", "--", "sh", "-c", "exit 5").stdout.strip()
    for command in ("status", "describe"):
        assert cli(env, command, ok).returncode == 0
        done = cli(env, command, failed)
        assert done.returncode == 1 and "FAILED" in done.stdout
        assert done.stderr == f"Error: {failed} FAILED: sh/0 exited with code 5\n"
    missing = cli(env, "status", "local://nobody/no-such-app")
    assert missing.returncode == 1
    assert missing.stderr == "Error: no app local://nobody/no-such-app\n"


@pytest.mark.parametrize(
    "command",
    [
        [], ["run"], ["status"], ["describe"], ["log"], ["cancel"], ["list"], ["runopts"],
        ["completion"], ["run", "echo"], ["run", "sh"], ["run", "ddp"],
        ["run", "examples/demo_app.py:demo"],
    ],
    ids=lambda c: " ".join(c) or "asupervisor",
)  # fmt: skip
@pytest.mark.parametrize("flag", ["-h", "--help"])
def test_help_works_on_every_command_and_component(
    env: dict[str, str], command: list[str], flag: str
) -> None:
    done = subprocess.run(
        [*CLI, *command, flag], env=env, capture_output=True, text=True, timeout=TIMEOUT,
        cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"Usage: asupervisor {' '.join(command)}".rstrip()), done.stdout


def test_ddp_named_resource_is_spelled_long(env: dict[str, str]) -> None:
    """``-h`` is help everywhere, so ddp's ``h`` (TorchX's named resource) is ``--h``."""
    done = cli(env, "run", "--dryrun", "--json", "ddp", "--h", "nonexistent", "--script", "t.py")
    assert done.returncode == 2, done.stderr  # parsed, then validated
    assert "Error: --h 'nonexistent': expected one of" in done.stderr  # as the user spells it


@pytest.mark.parametrize("user", [None, "someone"], ids=["no-USER", "USER"])
def test_the_readme_handle_form_works_with_and_without_user(
    env: dict[str, str], user: str | None
) -> None:
    """``local://$USER/ID`` as a shell expands it: ``local:///ID`` where $USER is unset."""
    env = {k: v for k, v in env.items() if k != "USER"}
    if user is not None:
        env["USER"] = user
    done = cli(env, "run", "--", "true")
    assert done.returncode == 0, done.stderr
    handle = done.stdout.strip()
    app_id = handle.rpartition("/")[2]
    if user is not None:
        assert handle == f"local://{user}/{app_id}"
    typed = f"local://{user or ''}/{app_id}"
    shown = cli(env, "status", typed)
    assert shown.returncode == 0, shown.stderr
    assert handle in shown.stdout and "SUCCEEDED" in shown.stdout


def _iso(text: str) -> float:
    return datetime.fromisoformat(text).timestamp()


def test_times_in_json_and_human_output_and_one_roles_list(env: dict[str, str]) -> None:
    done = cli(env, "run", "--wait", "--json", "--", "sh", "-c", "sleep 0.2")
    assert done.returncode == 0, done.stderr
    final = json.loads(done.stdout.splitlines()[-1])
    assert _iso(final["submitted"]) <= _iso(final["started"]) <= _iso(final["ended"])
    assert _iso(final["ended"]) - _iso(final["started"]) >= 0.2
    handle = final["handle"]
    status = cli_json(env, "status", handle)
    assert {k: status[k] for k in ("submitted", "started", "ended")} == {
        k: final[k] for k in ("submitted", "started", "ended")
    }
    described = cli_json(env, "describe", handle)
    assert "roles_statuses" not in described
    (role,) = described["roles"]
    assert role["name"] == "sh" and role["entrypoint"] == "sh"
    assert role["replicas"][0]["state"] == "SUCCEEDED"
    assert described["ended"] == final["ended"]
    listed = next(a for a in cli_json(env, "list") if a["handle"] == handle)
    assert (listed["submitted"], listed["ended"]) == (final["submitted"], final["ended"])
    human = cli(env, "status", handle).stdout
    ended = datetime.fromisoformat(final["ended"]).astimezone().strftime("%Y-%m-%d %H:%M:%S")
    assert f"ended {ended}" in human and "submitted " in human and "started " in human
    assert ended in cli(env, "list").stdout
    failed = cli(env, "run", "--json", "--", "/no/such/program").stdout.splitlines()[0]
    never_ran = cli_json(env, "status", json.loads(failed)["handle"])
    assert never_ran["started"] is None and never_ran["ended"] is not None


def _on_a_terminal(env: dict[str, str], *args: str) -> bytes:
    """What ``asupervisor ARGS`` writes to stdout when stdout is a terminal."""
    main, child = pty.openpty()
    try:
        proc = subprocess.Popen([*CLI, *args], env=env, stdout=child, stderr=subprocess.DEVNULL)
        os.close(child)
        out = b""
        while True:
            ready, _, _ = select.select([main], [], [], TIMEOUT)
            assert ready, "no output from the CLI"
            try:
                chunk = os.read(main, 65536)
            except OSError:  # EIO: the child closed the terminal
                break
            if not chunk:
                break
            out += chunk
        assert proc.wait(timeout=TIMEOUT) == 0
        return out
    finally:
        os.close(main)


def test_no_color_is_honoured_on_a_terminal(env: dict[str, str]) -> None:
    env = {k: v for k, v in env.items() if k not in ("NO_COLOR", "FORCE_COLOR")}
    env["TERM"] = "xterm-256color"
    handle = cli(env, "run", "sh", "--num_replicas", "2", "echo hi").stdout.strip()
    assert b"\x1b[" in _on_a_terminal(env, "status", handle)  # coloured states
    assert b"\x1b[" in _on_a_terminal(env, "log", handle)  # coloured prefixes
    plain = {**env, "NO_COLOR": "1"}
    for args, shown in ((("status", handle), b"SUCCEEDED"), (("log", handle), b"sh/1 | hi")):
        out = _on_a_terminal(plain, *args)
        assert b"\x1b[" not in out and shown in out, out


def test_log_level_prints_the_library_log_records(env: dict[str, str]) -> None:
    quiet = cli(env, "run", "--", "true")
    assert "INFO" not in quiet.stderr
    loud = cli(env, "--log-level", "info", "run", "--", "true")
    handle = loud.stdout.strip()
    assert f"INFO supervisor.cli.runcmd: launched {handle}" in loud.stderr
    bad = cli(env, "--log-level", "chatty", "list")
    assert bad.returncode == 2 and "chatty" in bad.stderr


def _bash_complete(env: dict[str, str], tmp_path: Path, line: str) -> list[str]:
    """Completions real bash offers for ``line`` after ``eval "$(asupervisor completion bash)"``."""
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    wrapper = bindir / "asupervisor"
    wrapper.write_text(f'#!/bin/sh\nexec {sys.executable} -m supervisor "$@"\n')
    wrapper.chmod(0o755)
    words = line.split(" ")
    script = (
        'eval "$(asupervisor completion bash)"\n'
        f"COMP_WORDS=({' '.join(words)}); COMP_CWORD={len(words) - 1}\n"
        "_asupervisor_completion asupervisor\n"
        'printf "%s\\n" "${COMPREPLY[@]}"\n'
    )
    path_env = {**env, "PATH": f"{bindir}{os.pathsep}{env['PATH']}"}
    done = subprocess.run(
        ["bash", "-c", script], env=path_env, capture_output=True, text=True, timeout=TIMEOUT
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


def test_completion_scripts_for_bash_zsh_and_fish(env: dict[str, str], tmp_path: Path) -> None:
    for shell in ("bash", "zsh", "fish"):
        done = cli(env, "completion", shell)
        assert done.returncode == 0 and "_ASUPERVISOR_COMPLETE" in done.stdout
    assert cli(env, "completion", "tcsh").returncode == 2
    assert _bash_complete(env, tmp_path, "asupervisor st") == ["status"]
    assert "--wait" in _bash_complete(env, tmp_path, "asupervisor run --w")


def test_python_dash_m_supervisor_runs_the_cli(env: dict[str, str]) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "supervisor", "run", "--", "true"],
        env=env, capture_output=True, text=True, timeout=TIMEOUT,
    )  # fmt: skip
    assert done.returncode == 0 and done.stdout.startswith("local://"), done.stderr


# -------------------------------------------------------------- mishaps
# What a user meets by mistake: each ends in one ``Error:`` line (or none, for a
# reader that left) and the documented exit code, never a traceback.

COMPONENT = """
from supervisor import AppDef

def boom(x: int = 1) -> AppDef:
    raise RuntimeError("kaboom")
"""


def one_error_line(done: subprocess.CompletedProcess[str]) -> str:
    """The ``Error:`` line of a failed command; the rest is click's usage hint or nothing."""
    assert "Traceback" not in done.stderr, done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1, done.stderr
    return errors[0]


def test_a_component_that_raises_is_named_in_one_line(env: dict[str, str], tmp_path: Path) -> None:
    """Before: any exception but ValueError from a component printed a traceback, exit 1
    (which says the app FAILED)."""
    (tmp_path / "comps.py").write_text(COMPONENT)
    done = cli(env, "run", "--dryrun", str(tmp_path / "comps.py") + ":boom")
    assert done.returncode == 2
    assert one_error_line(done).endswith("raised RuntimeError: kaboom")


def test_run_from_a_removed_directory_names_it(env: dict[str, str], tmp_path: Path) -> None:
    """The replicas start in the caller's directory: a removed one is a usage error."""
    gone = tmp_path / "gone"
    gone.mkdir()
    done = subprocess.run(
        ["sh", "-c", 'cd "$1" && rmdir "$1" && shift && exec "$@"', "sh", str(gone),
         *CLI, "run", "--dryrun", "echo"],
        env=env, capture_output=True, text=True, timeout=TIMEOUT, check=False,
    )  # fmt: skip
    assert done.returncode == 2
    assert "cwd: the current working directory was removed" in done.stderr
    assert "Traceback" not in done.stderr


def test_every_cfg_counts_and_a_key_in_two_is_refused(env: dict[str, str]) -> None:
    """Before: only the last ``--cfg`` applied, the others silently replaced by defaults."""
    both = cli(env, "run", "--dryrun", "--json", "--cfg", "stop_grace=1",
               "--cfg", "env_policy=clean", "echo")  # fmt: skip
    assert both.returncode == 0, both.stderr
    request = json.loads(both.stdout)
    assert (request["stop_grace"], request["env_policy"]) == (1.0, "clean")
    twice = cli(env, "run", "--dryrun", "--cfg", "stop_grace=1", "--cfg", "stop_grace=2", "echo")
    assert twice.returncode == 2
    assert "cfg.stop_grace: given more than once" in twice.stderr


def test_a_reader_that_leaves_ends_the_command_as_sigpipe_would(env: dict[str, str]) -> None:
    """``asupervisor log H | head -1``: exit 141 and nothing on stderr. Before: exit 1,
    which says the app FAILED."""
    done = cli(env, "run", "--wait", "--", "seq", "1", "200000")
    assert done.returncode == 0, done.stderr
    handle = done.stdout.splitlines()[0]
    reader = subprocess.Popen(
        [*CLI, "log", handle], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    assert reader.stdout is not None and reader.stderr is not None
    assert reader.stdout.readline() == b"seq/0 | 1\n"
    reader.stdout.close()  # the reader leaves, as head does
    assert reader.wait(TIMEOUT) == 141
    assert reader.stderr.read() == b""
    reader.stderr.close()


@pytest.mark.parametrize("command", [["status"], ["describe"], ["list"]])
def test_a_reader_gone_before_a_table_is_printed_is_sigpipe_too(
    env: dict[str, str], command: list[str]
) -> None:
    """rich's console ends the process itself on a broken pipe, with exit 1 (FAILED)."""
    done = cli(env, "run", "--wait", "--", "true")
    assert done.returncode == 0, done.stderr
    handle = done.stdout.splitlines()[0]
    args = [*command, handle] if command != ["list"] else command
    reader = subprocess.Popen(
        [*CLI, *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    assert reader.stdout is not None and reader.stderr is not None
    reader.stdout.close()  # gone before the first line
    assert reader.wait(TIMEOUT) == 141
    assert reader.stderr.read() == b""
    reader.stderr.close()


needs_mounts = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("unshare") is None,
    reason="a read-only bind mount needs root and unshare",
)


def read_only(env: dict[str, str], state_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``asupervisor ARGS`` with the state directory bound read-only, in its own mount
    namespace: nothing outside that one command sees the mount."""
    script = 'mount --bind -o ro "$1" "$1" && shift && exec "$@"'
    return subprocess.run(
        ["unshare", "-m", "--propagation", "private", "sh", "-c", script, "sh",
         str(state_dir), *CLI, *args],
        env=env, capture_output=True, text=True, timeout=TIMEOUT, check=False,
    )  # fmt: skip


@needs_mounts
def test_gc_and_cancel_on_a_read_only_state_dir_say_what_they_could_not_write(
    env: dict[str, str], state_dir: Path, background: Any
) -> None:
    """Before: a raw OSError traceback, exit 1, from both."""
    ended = cli(env, "run", "--wait", "--", "true").stdout.splitlines()[0]
    gc = read_only(env, state_dir, "gc", "--keep", "0")
    assert gc.returncode == 1
    line = one_error_line(gc)
    assert f"cannot remove the records of {ended}" in line and "Read-only file system" in line
    assert cli(env, "status", ended).returncode == 0  # still there

    run = background("run", "--wait", "--", "sh", "-c", "exec sleep 30")
    handle = run.read_line()
    wait_for_state(env, handle, "RUNNING")
    cancel = read_only(env, state_dir, "cancel", handle)
    assert cancel.returncode == 1
    line = one_error_line(cancel)
    assert f"cannot ask for {handle} to be cancelled" in line and "Read-only" in line
    assert cli(env, "status", handle).returncode == 0  # RUNNING: nothing was asked
    assert cli(env, "cancel", handle).returncode == 0
    assert run.wait() == 3


def test_every_command_with_a_backend_takes_torchx_s_and_scheduler(env: dict[str, str]) -> None:
    """``-s``/``--scheduler`` worked on ``run`` only; ``list -s local_docker`` is what a
    TorchX user types. Each spelling reaches the backend: an unknown one is named."""
    for args in (
        ("list",),
        ("gc", "--keep", "5", "--dry-run"),
        ("cancel", "--all", "--yes"),
        ("cluster",),
    ):
        for flag in ("-s", "--scheduler"):
            done = cli(env, *args, flag, "nosuch")
            assert done.returncode == 2, (args, flag, done.stderr)
            assert "nosuch" in done.stderr and "No such option" not in done.stderr, done.stderr


def _cancel_asking_on_a_pty(env: dict[str, str], typed: bytes | None) -> tuple[int, str]:
    """``cancel --all`` with a terminal on stdin: ``typed`` is the answer, or None for
    Ctrl-C (SIGINT, as the terminal sends it) once the question is on stderr."""
    main, child = pty.openpty()
    try:
        if typed is not None:
            os.write(main, typed)
        proc = subprocess.Popen(
            [*AS_FROM_A_SHELL, "--session", "asker", "cancel", "--all"],
            env=env, stdin=child, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        )  # fmt: skip
        assert proc.stderr is not None
        err = b""
        if typed is None:
            deadline = time.monotonic() + TIMEOUT
            while b"[y/N]" not in err:
                ready, _, _ = select.select([proc.stderr], [], [], deadline - time.monotonic())
                assert ready, f"no question within {TIMEOUT} s; got {err!r}"
                chunk = os.read(proc.stderr.fileno(), 65536)
                assert chunk, f"stderr closed before the question; got {err!r}"
                err += chunk
            # input() writes the question, then reads: a SIGINT between the two is taken
            # only once the read returns (CPython runs the handler between bytecodes), so
            # the signal comes once it reads, as a person's Ctrl-C does.
            time.sleep(0.5)
            proc.send_signal(signal.SIGINT)
        err += proc.stderr.read()
        proc.stderr.close()
        return proc.wait(TIMEOUT), err.decode()
    finally:
        os.close(child)
        os.close(main)


def test_cancel_all_answered_no_says_nothing_was_cancelled(
    env: dict[str, str], background: Any
) -> None:
    """A "no" printed click's ``Aborted!``, not the one ``Error:`` line every non-zero
    exit comes with; Ctrl-C at the question did too, and exited 1, not 130."""
    run = background("--session", "asker", "run", "--wait", "--", "sh", "-c", "exec sleep 30")
    handle = run.read_line()
    wait_for_state(env, handle, "RUNNING")
    for typed, code, last in (
        (b"n\n", 1, "Error: nothing cancelled: the answer was no"),
        (b"\x04", 1, "Error: nothing cancelled: no answer"),  # Ctrl-D: end of input
        (None, 130, "Error: interrupted (SIGINT)"),
    ):
        returncode, err = _cancel_asking_on_a_pty(env, typed)
        assert returncode == code, err
        assert handle in err and "Cancel these 1 app? [y/N]" in err, err
        assert err.endswith(f"{last}\n") and err.count("Error:") == 1, err
        assert "Aborted!" not in err and "cancel requested" not in err, err
        assert cli_json(env, "status", handle)["state"] == "RUNNING"
    returncode, err = _cancel_asking_on_a_pty(env, b"y\n")
    assert returncode == 0 and f"cancel requested: {handle}" in err, err
    assert run.wait() == 3, run.stderr()


def test_hold_of_an_app_nobody_recorded_is_no_such_app(env: dict[str, str]) -> None:
    """The local backend refused before looking: exit 2 "cannot hold" for a handle that
    names no app, where `hold`'s help (and every other command) says exit 1."""
    for verb in ("hold", "release"):
        missing = cli(env, verb, "local://me/nope-0")
        assert missing.returncode == 1, missing.stderr
        assert one_error_line(missing) == "Error: no app local://me/nope-0"
    handle = cli(env, "run", "--", "true").stdout.strip()
    for verb in ("hold", "release"):
        refused = cli(env, verb, handle)
        assert refused.returncode == 2, refused.stderr
        assert "the local backend cannot" in refused.stderr and "(slurm can)" in refused.stderr
