"""The built-in components' AppDefs: roles, args, env and macros."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from supervisor import AppDef, RetryPolicy, Role, macros
from supervisor.components import BUILTINS, TORCHX_NAMES, ddp, echo, parse_j, sh
from supervisor.specs import PROCS_PER_NODE
from supervisor.validate import Capabilities, validate

LOCAL = Capabilities(backend="local")
VALUES = macros.Values(img_root="", app_id="app-1", replica_id="3", rank0_env="TORCHX_RANK0_HOST")


def only_role(app: AppDef) -> Role:
    assert len(app.roles) == 1
    return app.roles[0]


def test_builtins_are_named_and_documented() -> None:
    assert set(BUILTINS) == {"echo", "sh", "ddp", "mpi"}
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


def test_each_builtin_but_mpi_takes_the_image_to_run_in_as_torchx_does() -> None:
    """``--image``, as TorchX's utils.echo, utils.sh and dist.ddp spell it; none by default
    (local and Slurm run on the host)."""
    for make in (echo, sh, lambda **kw: ddp("t.py", **kw)):
        assert only_role(make()).image == ""
        assert only_role(make(image="repo/img:1")).image == "repo/img:1"
    assert only_role(ddp("t.py", j="2x1", mode="torchrun", image="i:2")).image == "i:2"


@pytest.mark.parametrize(
    ("j", "expected"), [("1x2", (1, 2)), ("2x4", (2, 4)), ("3", (1, 3)), (" 2x1 ", (2, 1))]
)
def test_parse_j(j: str, expected: tuple[int, int]) -> None:
    assert parse_j(j) == expected


@pytest.mark.parametrize("j", ["", "x2", "2x", "0x2", "2x0", "two", "1x2x3", "-1"])
def test_parse_j_rejects(j: str) -> None:
    with pytest.raises(ValueError, match="-j"):
        parse_j(j)


def test_parse_j_takes_an_int_as_the_api_may_pass_it() -> None:
    assert parse_j(4) == (1, 4)
    with pytest.raises(ValueError, match="-j"):
        parse_j(None)  # type: ignore[arg-type]


@pytest.mark.parametrize("option", ["cpu", "gpu", "memMB"])
@pytest.mark.parametrize("value", [-5, True, 1.5, "2"])
def test_ddp_refuses_a_resource_that_is_no_count(option: str, value: object) -> None:
    """Each rank's share of -5 was -1 ("unset"), so nothing ever saw the bad value."""
    with pytest.raises(ValueError, match=f"--{option}"):
        ddp("train.py", j="1x4", **{option: value})  # type: ignore[arg-type]


def test_torchx_utils_sh_runs_each_argument_as_one_word_as_torchx_does() -> None:
    """TorchX's ``utils.sh`` quotes every argument: a ported ``utils.sh python3 -c
    'print("hello world")'`` failed with a shell syntax error when it meant ``sh``."""
    from supervisor.cli.components import load_component

    component = load_component("utils.sh")
    assert component is TORCHX_NAMES["utils.sh"] and load_component("sh") is sh
    role = only_role(component("python3", "-c", 'print("hello world")', "a  b"))
    assert role.entrypoint == "sh" and role.name == "sh"
    line = role.args[1].replace("python3", sys.executable, 1)
    done = subprocess.run(["sh", "-c", line], capture_output=True, text=True, check=True)
    assert done.stdout == "hello world\n"
    assert role.args[1].endswith("'a  b'")  # one word, spaces kept


def test_a_ranks_share_of_memory_is_rounded_up() -> None:
    """3 MB over 4 ranks was 0 MB each: no limit at all."""
    (role,) = ddp("train.py", j="1x4", memMB=3).roles
    assert role.resource.memMB == 1


def test_ddp_role_env_resources_and_placement() -> None:
    app = ddp("train.py", "--lr", "0.1", j="2x3", max_retries=2, cpu=6, memMB=3000)
    validate(app, LOCAL)
    assert app.name == "train"
    role = only_role(app)
    assert role.name == "train" and role.entrypoint == "sh"  # the role is named after the script
    assert role.num_replicas == 6 and role.max_retries == 2
    assert dict(role.metadata) == {PROCS_PER_NODE: 3}  # Slurm: 2 nodes x 3 tasks
    assert (role.resource.cpu, role.resource.gpu, role.resource.memMB) == (2, 0, 1000)
    env = dict(role.env)
    assert env["RANK"] == env["ROLE_RANK"] == "${replica_id}"
    assert env["WORLD_SIZE"] == env["ROLE_WORLD_SIZE"] == "6"
    assert (env["LOCAL_WORLD_SIZE"], env["GROUP_WORLD_SIZE"]) == ("3", "2")
    assert env["ROLE_NAME"] == "train" and env["TORCHELASTIC_RUN_ID"] == "${app_id}"
    assert env["TORCHELASTIC_MAX_RESTARTS"] == "2" and env["OMP_NUM_THREADS"] == "1"
    flag, script = VALUES.apply(role).args
    assert flag == "-c"
    # The escape gives the shell a `$`, the macro the variable's name.
    assert 'MASTER_ADDR="$TORCHX_RANK0_HOST"' in script
    assert "LOCAL_RANK=$((RANK % 3))" in script and "GROUP_RANK=$((RANK / 3))" in script
    assert script.endswith("exec python train.py --lr 0.1")  # python on PATH, not baked in


def test_ddp_script_module_interpreter_env_and_port_options() -> None:
    assert ddp("dir/job.py", name="mine").name == "mine"
    role = only_role(ddp(script="x.py", rdzv_port=1234, env={"A": "b", "OMP_NUM_THREADS": "4"}))
    assert "MASTER_PORT=1234;" in role.args[1]
    assert role.env["A"] == "b" and role.env["OMP_NUM_THREADS"] == "4"
    module = only_role(ddp("--flag", m="pkg.trainer", interpreter="/opt/py/bin/python3"))
    assert module.name == "trainer"
    assert module.args[1].endswith("exec /opt/py/bin/python3 -m pkg.trainer --flag")
    assert only_role(ddp("x.py", j="1")).env.get("OMP_NUM_THREADS") is None
    assert only_role(ddp("x.py", h="cpu.large", j="1x2")).resource.cpu == 4
    with pytest.raises(ValueError, match="-j"):
        ddp("x.py", j="bad")
    with pytest.raises(ValueError, match="either --script or -m"):
        ddp(script="a.py", m="b")
    with pytest.raises(ValueError, match="expected a script"):
        ddp()
    with pytest.raises(ValueError, match="-h"):
        ddp("x.py", h="huge")


@pytest.mark.parametrize("j", ["1x2", "2x1"])
def test_ddp_ports_differ_per_app_and_agree_within_one(j: str) -> None:
    """Derived from the app id by every rank alike, on one node too: a free port chosen
    when the AppDef was made went with every submit of it, and two submits of one AppDef
    took each other's ranks (or failed with EADDRINUSE)."""
    role = only_role(ddp("x.py", j=j, interpreter=sys.executable))
    ports = set()
    for app_id in ("app-1", "app-2"):
        for rank in ("0", "1"):
            values = macros.Values(img_root="", app_id=app_id, replica_id=rank, rank0_env="H")
            shell = values.apply(role).args[1].split(" exec ")[0] + ' echo "$MASTER_PORT"'
            done = subprocess.run(["sh", "-c", shell], capture_output=True, text=True, check=True)
            ports.add((app_id, int(done.stdout)))
    assert len(ports) == 2 and len({p for _, p in ports}) == 2


@pytest.mark.parametrize("port", [-1, 65536, "29500", True])
def test_ddp_refuses_a_rendezvous_port_that_is_no_port(port: object) -> None:
    with pytest.raises(ValueError, match="--rdzv_port"):
        ddp("x.py", rdzv_port=port)  # type: ignore[arg-type]


def test_ddp_derived_ports_stay_below_the_ephemeral_range() -> None:
    """A port the kernel lent an outgoing connection cannot be listened on (EADDRINUSE)."""
    ephemeral_low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    role = only_role(ddp("x.py", j="2x1", interpreter=sys.executable))
    lines = []
    for n in range(40):
        values = macros.Values(img_root="", app_id=f"ddp-{n:08x}", replica_id="0", rank0_env="H")
        lines.append(values.apply(role).args[1].split(" exec ")[0] + ' echo "$MASTER_PORT";')
    done = subprocess.run(["sh", "-c", " ".join(lines)], capture_output=True, text=True, check=True)
    ports = [int(p) for p in done.stdout.split()]
    assert len(ports) == 40 and len(set(ports)) > 30
    assert all(20000 <= p < min(ephemeral_low, 32768) for p in ports), sorted(ports)


def test_ddp_torchrun_mode_is_one_replica_per_node() -> None:
    role = only_role(ddp("t.py", "--x", j="2x4", mode="torchrun", max_retries=3))
    assert role.num_replicas == 2 and PROCS_PER_NODE not in role.metadata
    line = VALUES.apply(role).args[1]
    for piece in (
        "-m torch.distributed.run",
        "--nnodes=2",
        "--nproc_per_node=4",
        "--max_restarts=3",
        "--rdzv_backend=c10d",
        '--rdzv_endpoint="$MASTER_ADDR:$MASTER_PORT"',
        "--rdzv_id=app-1",
    ):
        assert piece in line
    assert line.endswith("t.py --x")
    # One node too: --standalone would give the workers a random TORCHELASTIC_RUN_ID.
    one_node = VALUES.apply(only_role(ddp("t.py", j="1x2", mode="torchrun"))).args[1]
    assert "--standalone" not in one_node and "--rdzv_id=app-1" in one_node


def test_ddp_torchrun_mode_gives_each_rendezvous_round_its_own_store() -> None:
    """torchrun's shared store would hand a restarted round the dead round's addresses."""
    torchrun = only_role(ddp("t.py", j="2x1", mode="torchrun"))
    assert torchrun.env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] == "1"
    mine = ddp("t.py", j="2x1", mode="torchrun", env={"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "0"})
    assert only_role(mine).env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] == "0"
    assert "TORCH_DISABLE_SHARE_RDZV_TCP_STORE" not in only_role(ddp("t.py", j="2x1")).env


def test_ddp_shell_line_runs_the_script_with_every_variable(tmp_path: Path) -> None:
    """Run the rendered `sh -c` line for rank 3 of a 2x2 job, as a replica would."""
    script = tmp_path / "report.py"
    script.write_text(
        "import json, os, sys\n"
        "keys = ['RANK', 'WORLD_SIZE', 'LOCAL_RANK', 'LOCAL_WORLD_SIZE', 'GROUP_RANK',"
        " 'MASTER_ADDR', 'MASTER_PORT', 'TORCHELASTIC_RESTART_COUNT', 'TORCHELASTIC_RUN_ID']\n"
        "print(json.dumps({'env': {k: os.environ.get(k) for k in keys}, 'argv': sys.argv[1:]}))\n"
    )
    app = ddp(str(script), "a b", "$HOME", "it's", j="2x2", rdzv_port=29511)
    role = VALUES.apply(only_role(app))
    env = {
        **os.environ,
        **role.env,
        "TORCHX_RANK0_HOST": "rank0.example",
        "ASUPERVISOR_ATTEMPT": "2",
        "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
    }
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
        "MASTER_PORT": "29511",
        "TORCHELASTIC_RESTART_COUNT": "2",
        "TORCHELASTIC_RUN_ID": "app-1",
    }
    assert report["argv"] == ["a b", "$HOME", "it's"]


def test_replica_retries_on_a_collective_job_warn() -> None:
    role = dataclasses.replace(
        only_role(ddp("x.py", j="1x2", max_retries=1)), retry_policy=RetryPolicy.REPLICA
    )
    with pytest.warns(UserWarning, match="cannot rejoin"):
        validate(AppDef(name="x", roles=[role]), LOCAL)
