"""The built-in components' AppDefs: roles, args, env and macros."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from supervisor import AppDef, Role, macros
from supervisor.components import BUILTINS, MASTER_PORT, ddp, echo, parse_j, sh
from supervisor.validate import Capabilities, validate

LOCAL = Capabilities(backend="local")
VALUES = macros.Values(img_root="", app_id="app-1", replica_id="3", rank0_env="TORCHX_RANK0_HOST")


def only_role(app: AppDef) -> Role:
    assert len(app.roles) == 1
    return app.roles[0]


def test_builtins_are_named_and_documented() -> None:
    assert set(BUILTINS) == {"echo", "sh", "ddp"}
    for fn in BUILTINS.values():
        assert fn.__doc__ and fn.__doc__.strip().splitlines()[0]


def test_echo_defaults_and_replicas() -> None:
    role = only_role(echo())
    assert (role.name, role.entrypoint, tuple(role.args)) == ("echo", "echo", ("hello world",))
    assert role.num_replicas == 1
    app = echo("hi ${replica_id}", num_replicas=3)
    validate(app, LOCAL)
    role = only_role(app)
    assert role.num_replicas == 3
    assert VALUES.apply(role).args == ("hi 3",)


def test_sh_joins_its_words_into_one_script() -> None:
    app = sh("echo", "hi", "&&", "exit", "3", num_replicas=2, name="job")
    validate(app, LOCAL)
    assert app.name == "job"
    role = only_role(app)
    assert (role.name, role.entrypoint, tuple(role.args)) == (
        "job",
        "sh",
        ("-c", "echo hi && exit 3"),
    )
    assert role.num_replicas == 2
    assert only_role(sh()).args == ("-c", "")


@pytest.mark.parametrize(
    ("j", "expected"), [("1x2", (1, 2)), ("2x4", (2, 4)), ("3", (1, 3)), (" 2x1 ", (2, 1))]
)
def test_parse_j(j: str, expected: tuple[int, int]) -> None:
    assert parse_j(j) == expected


@pytest.mark.parametrize("j", ["", "x2", "2x", "0x2", "2x0", "two", "1x2x3", "-1"])
def test_parse_j_rejects(j: str) -> None:
    with pytest.raises(ValueError, match="-j"):
        parse_j(j)


def test_ddp_role_env_and_macros() -> None:
    app = ddp("train.py", "--lr", "0.1", j="2x3", max_retries=2)
    validate(app, LOCAL)
    assert app.name == "train"
    role = only_role(app)
    assert role.name == "trainer" and role.entrypoint == "sh"
    assert role.num_replicas == 6 and role.max_retries == 2
    assert dict(role.env) == {
        "RANK": "${replica_id}",
        "WORLD_SIZE": "6",
        "LOCAL_WORLD_SIZE": "3",
        "MASTER_PORT": str(MASTER_PORT),
    }
    assert MASTER_PORT == 29500
    resolved = VALUES.apply(role)
    assert resolved.env["RANK"] == "3"
    flag, script = resolved.args
    assert flag == "-c"
    # The escape gives the shell a `$`, the macro the variable's name.
    assert 'MASTER_ADDR="$TORCHX_RANK0_HOST"' in script
    assert "LOCAL_RANK=$((RANK % 3))" in script and "GROUP_RANK=$((RANK / 3))" in script
    assert script.endswith(f"exec {sys.executable} train.py --lr 0.1")


def test_ddp_name_and_port_options() -> None:
    assert ddp("dir/job.py", name="mine").name == "mine"
    assert ddp("x.py", master_port=1234).roles[0].env["MASTER_PORT"] == "1234"
    with pytest.raises(ValueError, match="-j"):
        ddp("x.py", j="bad")


def test_ddp_shell_line_runs_the_script_with_every_variable(tmp_path: Path) -> None:
    """Run the rendered `sh -c` line for rank 3 of a 2x2 job, as a replica would."""
    script = tmp_path / "report.py"
    script.write_text(
        "import json, os, sys\n"
        "keys = ['RANK', 'WORLD_SIZE', 'LOCAL_RANK', 'LOCAL_WORLD_SIZE', 'GROUP_RANK',"
        " 'MASTER_ADDR', 'MASTER_PORT']\n"
        "print(json.dumps({'env': {k: os.environ.get(k) for k in keys}, 'argv': sys.argv[1:]}))\n"
    )
    role = VALUES.apply(only_role(ddp(str(script), "a b", "$HOME", "it's", j="2x2")))
    env = {**os.environ, **role.env, "TORCHX_RANK0_HOST": "rank0.example"}
    done = subprocess.run(
        [role.entrypoint, *role.args], env=env, capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["env"] == {
        "RANK": "3",
        "WORLD_SIZE": "4",
        "LOCAL_RANK": "1",
        "LOCAL_WORLD_SIZE": "2",
        "GROUP_RANK": "1",
        "MASTER_ADDR": "rank0.example",
        "MASTER_PORT": "29500",
    }
    assert report["argv"] == ["a b", "$HOME", "it's"]
