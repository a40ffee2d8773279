"""The CLI in-process (click's CliRunner): everything that launches no process."""

from __future__ import annotations

import json
import signal
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from supervisor.cli.main import cli
from supervisor.cli.runcmd import _handled_signals


def invoke(*args: str) -> Result:
    return CliRunner().invoke(cli, list(args), prog_name="asupervisor")


def test_dryrun_prints_the_request_and_launches_nothing(state_dir: Path) -> None:
    result = invoke("--session", "me", "run", "--dryrun", "echo", "--msg", "hi there")
    assert result.exit_code == 0, result.output
    assert "local app echo-" in result.stdout and "(session me)" in result.stdout
    assert "echo/0:" in result.stdout and "echo 'hi there'" in result.stdout
    assert not (state_dir / "logs").exists()


def test_dryrun_json_and_cfg(state_dir: Path, tmp_path: Path) -> None:
    logs = tmp_path / "elsewhere"
    result = invoke(
        "run", "--dryrun", "--json", "--cfg", f"log_dir={logs},stop_grace=1", "sh",
        "--num_replicas", "2", "echo", "hi",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["backend"] == "local"
    assert data["app_dir"].startswith(str(logs))
    assert data["stop_grace"] == 1.0
    assert [r["argv"] for r in data["replicas"]] == [["sh", "-c", "echo hi"]] * 2
    assert not logs.exists()


def test_dryrun_of_a_command_after_double_dash(state_dir: Path) -> None:
    result = invoke("run", "--dryrun", "--json", "--", sys.executable, "-c", "print(1)")
    assert result.exit_code == 0, result.output
    (replica,) = json.loads(result.stdout)["replicas"]
    assert replica["role"] == Path(sys.executable).name.replace(".", "-")
    assert replica["argv"] == [sys.executable, "-c", "print(1)"]


def test_echo_as_a_command_is_not_the_component(state_dir: Path) -> None:
    result = invoke("run", "--dryrun", "--json", "--", "echo", "--msg")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["replicas"][0]["argv"] == ["echo", "--msg"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--cfg", "lgo_dir=/x", "echo"], "did you mean 'log_dir'"),
        (["--cfg", "stop_grace=soon", "echo"], "cfg.stop_grace"),
        (["echo", "--num_replicas", "0"], "roles[0].num_replicas"),
        (["sh", "--name", "no spaces"], "invalid app"),
        (["--backend", "nope", "echo"], "no backend named 'nope'"),
    ],
)
def test_invalid_apps_and_options_exit_2(state_dir: Path, args: list[str], message: str) -> None:
    result = invoke("run", "--dryrun", *args)
    assert result.exit_code == 2, result.output
    assert message in result.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([], "missing TARGET"),
        (["--"], "expected a command after --"),
        (["nope"], "unknown component 'nope'"),
        (["--bogus", "echo"], "No such option '--bogus'"),
        (["echo", "--bogus"], "No such option '--bogus'"),
        (["echo", "--num_replicas", "many"], "'many' is not a valid integer"),
        (["ddp", "-j", "2y2", "t.py"], "expected NNODESxNPROC_PER_NODE"),
    ],
)
def test_usage_errors_exit_2(state_dir: Path, args: list[str], message: str) -> None:
    result = invoke("run", "--dryrun", *args)
    assert result.exit_code == 2, result.output
    assert message in result.stderr


def test_run_help_documents_exit_codes_and_builtins() -> None:
    result = invoke("run", "--help")
    assert result.exit_code == 0
    for text in ("0 SUCCEEDED", "1 FAILED", "3 CANCELLED", "4 UNKNOWN", "130", "143"):
        assert text in result.stdout
    for name in ("echo", "sh", "ddp"):
        assert f"  {name} " in result.stdout
    assert "stays until the app ends even" in result.stdout


def test_runopts_text_and_json() -> None:
    result = invoke("runopts", "local")
    assert result.exit_code == 0
    assert "log_dir" in result.stdout and "stop_grace" in result.stdout
    rows = json.loads(invoke("runopts", "local", "--json").stdout)
    assert {r["name"] for r in rows} >= {"log_dir", "prepend_cwd", "stop_grace"}
    assert next(r for r in rows if r["name"] == "stop_grace")["type"] == "float"
    unknown = invoke("runopts", "nope")
    assert unknown.exit_code == 2 and "no backend named 'nope'" in unknown.stderr


@pytest.mark.parametrize("command", ["status", "describe", "cancel", "log"])
def test_unknown_apps_exit_1_and_malformed_handles_exit_2(state_dir: Path, command: str) -> None:
    missing = invoke(command, "local://me/no-such-app")
    assert missing.exit_code == 1, missing.output
    assert "no app local://me/no-such-app" in missing.stderr
    malformed = invoke(command, "not-a-handle")
    assert malformed.exit_code == 2
    assert "is not of the form backend://session/app_id" in malformed.stderr


def test_list_of_an_empty_state_dir(state_dir: Path) -> None:
    result = invoke("list", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == []
    assert "no apps" in invoke("list").stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--regex", "("], "--regex"),
        (["--since", "soon"], "not a time"),
        (["--streams", "both"], "'both' is not one of"),
    ],
)
def test_log_options_are_checked(state_dir: Path, args: list[str], message: str) -> None:
    result = invoke("log", "local://me/app", *args)
    assert result.exit_code == 2
    assert message in result.stderr


def test_state_dir_and_session_options(tmp_path: Path, state_dir: Path) -> None:
    other = tmp_path / "other-home"
    result = invoke(
        "--state-dir", str(other), "--session", "team", "run", "--dryrun", "--json", "echo"
    )
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["session"] == "team"
    assert data["app_dir"].startswith(str(other / "logs" / "team"))
    bad = invoke("--session", "a/b", "run", "--dryrun", "echo")
    assert bad.exit_code == 2 and "session: must not contain '/'" in bad.stderr


def test_a_signal_ignored_at_start_stays_ignored() -> None:
    hangup = signal.signal(signal.SIGHUP, signal.SIG_DFL)  # as a shell starts it
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        assert _handled_signals() == [signal.SIGTERM, signal.SIGHUP]
        signal.signal(signal.SIGHUP, signal.SIG_IGN)  # nohup
        assert _handled_signals() == [signal.SIGTERM]
    finally:
        signal.signal(signal.SIGINT, previous)
        signal.signal(signal.SIGHUP, hangup)
    signal.signal(signal.SIGHUP, signal.SIG_DFL)
    try:
        assert _handled_signals() == [signal.SIGINT, signal.SIGTERM, signal.SIGHUP]
    finally:
        signal.signal(signal.SIGHUP, hangup)


def test_list_shows_a_damaged_index_entry_with_its_reason(state_dir: Path) -> None:
    """Issue 19: a stray file in the index made ``list`` fail for every app."""
    session = state_dir / "index" / "local" / "me"
    session.mkdir(parents=True)
    (session / "stray.json").write_text("[]")
    listed = json.loads(invoke("list", "--json").stdout)
    assert listed == [
        {
            "handle": "local://me/stray",
            "app_id": "stray",
            "name": "",
            "state": "UNKNOWN",
            "msg": f"damaged record: {session / 'stray.json'}: the entry is [], not dict",
            "submitted": None,
            "started": None,
            "ended": None,
        }
    ]
    table = invoke("list").stdout
    assert "msg" in table.splitlines()[0] and "damaged record:" in table
