"""``ddp``: a torchrun-style data-parallel job, in one of two launch modes.

* ``mode="rank"`` (default): one replica per rank, NNODES x NPROC replicas of
  ``python SCRIPT ARGS...``; each rank is its own replica with its own state,
  logs and exit code. The role carries :data:`PROCS_PER_NODE` in its metadata
  so a backend that places processes on nodes (Slurm) asks for NNODES nodes
  with NPROC tasks each instead of one node per rank.
* ``mode="torchrun"``: one replica per node running ``torchrun`` with a c10d
  rendezvous, as TorchX does; torchrun restarts its workers in place
  (``--max_restarts``) before the supervisor sees a failure. torchrun runs
  with ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1`` (see :data:`TORCHRUN_ENV`):
  without it an in-place restart fails or hangs.

Either way every rank sees what torchrun sets: RANK, LOCAL_RANK, GROUP_RANK,
ROLE_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_WORLD_SIZE, ROLE_WORLD_SIZE,
ROLE_NAME, MASTER_ADDR, MASTER_PORT, TORCHELASTIC_RUN_ID (the app id, which
namespaces the rendezvous), TORCHELASTIC_RESTART_COUNT,
TORCHELASTIC_MAX_RESTARTS and OMP_NUM_THREADS=1 when several processes share
a node (unless ``env`` sets it).
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping
from pathlib import Path

from supervisor.specs import PROCS_PER_NODE, AppDef, Resource, Role, macros

__all__ = [
    "MASTER_PORT",
    "NAMED_RESOURCES",
    "TORCHRUN_ENV",
    "ddp",
    "parse_j",
    "role_name",
]

MASTER_PORT = 29500
"""torchrun's default rendezvous port; ddp only uses it when asked to (``--rdzv_port``)."""

TORCHRUN_ENV: Mapping[str, str] = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
"""What torchrun mode sets for torchrun itself (``env`` can override it).

Since pytorch/pytorch#128096 (2024) torchrun's agent hosts the store
its workers bootstrap their process group from (it gives them
MASTER_ADDR:MASTER_PORT of that store and TORCHELASTIC_USE_AGENT_STORE=True),
and it builds that store once: in
``DynamicRendezvousHandler.next_rendezvous``
(torch/distributed/elastic/rendezvous/dynamic_rendezvous.py) the server is
created only while ``_bootstrap_store_info is None``, so every later round of
the rendezvous hands the workers the same store, keys and all. Workers key
their process group's addresses by group and rank only (gloo writes
``default_pg/0//cpu//0/<rank>``; nothing says which round), so after an
in-place restart the new workers find the dead round's addresses there. A rank
that reads its peer's key before the peer has rewritten it gets a dead port:
either it connects to it and the round fails ("Connection refused", the
restart is spent), or, as gloo's TCP pair picks which side listens by
comparing the two addresses, both ranks choose to listen and wait for each
other until gloo's 30-minute timeout. Which one happens is a race, so the
restart worked in some runs and failed or hung in others.

``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1`` is torch's switch back to the
earlier way (pytorch/pytorch#135712): each round the rendezvous publishes a
fresh free port under its round's prefix and rank 0's worker hosts a new,
empty store there, so no round can read another's keys. It only concerns
torchrun's agent; ranks still get MASTER_ADDR and MASTER_PORT from it.
"""

NAMED_RESOURCES: Mapping[str, Resource] = {
    "cpu.small": Resource(cpu=1, gpu=0, memMB=1024),
    "cpu.medium": Resource(cpu=2, gpu=0, memMB=4096),
    "cpu.large": Resource(cpu=8, gpu=0, memMB=16384),
    "gpu.1": Resource(cpu=8, gpu=1, memMB=32768),
    "gpu.8": Resource(cpu=64, gpu=8, memMB=262144),
}
"""Resources by name for ``ddp -h NAME`` (per node)."""

_J = re.compile(r"(?:(\d+)x)?(\d+)")
_PORT_RANGE = (20000, 12768)
"""Apps derive their port from the app id: 20000 + (crc32(app id) mod 12768),
computed on each node by the job's own interpreter (an image need have no ``cksum``).

The range ends below 32768, where Linux's ephemeral ports begin (IANA's begin at
49152): a port the kernel gave an outgoing connection cannot be listened on, and
rank 0's store then failed with EADDRINUSE (seen once in CI with 20000-39999).
"""


def parse_j(j: str | int) -> tuple[int, int]:
    """``"NxM"`` -> (N nodes, M processes per node); a bare ``"M"`` (or the int M) means one
    node."""
    if isinstance(j, int) and not isinstance(j, bool):
        j = str(j)
    if not isinstance(j, str):
        raise ValueError(f"-j {j!r}: expected NNODESxNPROC_PER_NODE (e.g. 2x4) or NPROC")
    found = _J.fullmatch(j.strip())
    if found is None:
        raise ValueError(f"-j {j!r}: expected NNODESxNPROC_PER_NODE (e.g. 2x4) or NPROC")
    nnodes, nproc = int(found.group(1) or 1), int(found.group(2))
    if nnodes < 1 or nproc < 1:
        raise ValueError(f"-j {j!r}: node and process counts must be at least 1")
    return nnodes, nproc


def role_name(script: str | None, module: str | None) -> str:
    """TorchX's rule: the script's file name without ``.py``, or the module's last part."""
    base = Path(script).stem if script else (module or "").rpartition(".")[2]
    name = re.sub(r"[^A-Za-z0-9_-]+", "-", base).strip("-_")
    return name if name[:1].isalpha() else f"ddp-{name}".rstrip("-")


def _per_proc(total: int, nproc: int) -> int:
    """A node's share for one of its ``nproc`` ranks, rounded up: never 0 of something."""
    return -1 if total < 0 else -(-total // nproc)


def _node_resource(cpu: int, gpu: int, mem_mb: int) -> Resource:
    """The per-node request; ValueError naming the option for a value that is no count
    (a rank's share would otherwise turn -5 into "unset" before validation saw it)."""
    given: tuple[tuple[str, object], ...] = (("cpu", cpu), ("gpu", gpu), ("memMB", mem_mb))
    for option, value in given:
        if not isinstance(value, int) or isinstance(value, bool) or value < -1:
            raise ValueError(f"--{option} {value!r}: expected a count >= 0, or -1 for unset")
    return Resource(cpu=cpu, gpu=gpu, memMB=mem_mb)


def ddp(
    *script_args: str,
    script: str | None = None,
    m: str | None = None,
    j: str = "1x2",
    name: str | None = None,
    h: str | None = None,
    cpu: int = 2,
    gpu: int = 0,
    memMB: int = 1024,  # noqa: N803 (TorchX spells it so)
    env: dict[str, str] | None = None,
    max_retries: int = 0,
    rdzv_port: int = 0,
    mode: str = "rank",
    interpreter: str = "python",
    image: str = "",
) -> AppDef:
    """Run a Python script (or module) data-parallel, as torchrun would.

    ``asupervisor run ddp -j 2x2 --script train.py -- --lr 0.1`` (or simply
    ``ddp train.py --lr 0.1``). Rank 0's host is the rendezvous address; the
    port is derived from the app id (so two apps, two submits of one app
    among them, do not collide), or ``--rdzv_port``. Resources are
    per node, as in TorchX; in rank mode each rank asks for its share.

    Args:
        script_args: the script's arguments (the first is the script when
            neither --script nor -m is given)
        script: the Python script to run
        m: run this module instead of a script (python -m)
        j: NNODESxNPROC_PER_NODE, e.g. 2x4, or just NPROC for one node
        name: the app's name (default: the script's or module's name)
        h: a named resource per node (cpu.small, cpu.medium, cpu.large, gpu.1, gpu.8)
        cpu: CPUs per node
        gpu: GPUs per node
        memMB: memory per node in MB
        env: extra environment variables, k=v,k2=v2
        max_retries: restarts of the whole job after a failure (torchrun mode:
            also torchrun's in-place --max_restarts)
        rdzv_port: the rendezvous port, 1-65535 (0: derived as described above)
        mode: rank (one replica per rank) or torchrun (one torchrun per node)
        interpreter: the Python that runs the script on each node
        image: the container image to run it in (docker needs one; none for local)
    """
    nnodes, nproc = parse_j(j)
    args = list(script_args)
    if script is not None and m is not None:
        raise ValueError("give either --script or -m, not both")
    if script is None and m is None:
        if not args:
            raise ValueError("expected a script: --script FILE, -m MODULE, or FILE [ARGS...]")
        script = args.pop(0)
    if mode not in ("rank", "torchrun"):
        raise ValueError(f"--mode {mode!r}: expected rank or torchrun")
    if h is not None and h not in NAMED_RESOURCES:
        raise ValueError(f"--h {h!r}: expected one of {', '.join(NAMED_RESOURCES)}")
    node = NAMED_RESOURCES[h] if h else _node_resource(cpu, gpu, memMB)
    role = role_name(script, m)
    target = ["-m", m] if m else [str(script)]
    if not isinstance(rdzv_port, int) or isinstance(rdzv_port, bool) or not 0 <= rdzv_port <= 65535:
        raise ValueError(f"--rdzv_port {rdzv_port!r}: expected a port, 1-65535 (0: derived)")
    # Derived per app on one node too: a port chosen here, when the AppDef is made, went
    # with every submit of it, and two of them took each other's ranks or EADDRINUSE.
    port = str(rdzv_port)
    world = nnodes * nproc
    extra = dict(env or {})
    base_env = {
        "WORLD_SIZE": str(world),
        "LOCAL_WORLD_SIZE": str(nproc),
        "GROUP_WORLD_SIZE": str(nnodes),
        "ROLE_WORLD_SIZE": str(world),
        "ROLE_NAME": role,
        "TORCHELASTIC_RUN_ID": macros.app_id,
        "TORCHELASTIC_MAX_RESTARTS": str(max_retries),
        **({"OMP_NUM_THREADS": "1"} if nproc > 1 else {}),
        **extra,
    }
    # `$$` is a literal `$` for the shell; `$${rank0_env}` would stay literal
    # too, so the variable's name comes from a macro right after the escape.
    prelude = (
        f'export MASTER_ADDR="$${macros.rank0_env}"'
        f' TORCHELASTIC_RESTART_COUNT="$${{ASUPERVISOR_ATTEMPT:-0}}"'
        f" MASTER_PORT={_port_expr(port, interpreter)};"
    )
    if mode == "rank":
        shell = (
            f"{prelude} export LOCAL_RANK=$$((RANK % {nproc})) GROUP_RANK=$$((RANK / {nproc}));"
            f" exec {shlex.join([interpreter, *target, *args])}"
        )
        return AppDef(
            name=name or role,
            roles=[
                Role(
                    name=role,
                    entrypoint="sh",
                    args=["-c", shell],
                    image=image,
                    env={"RANK": macros.replica_id, "ROLE_RANK": macros.replica_id, **base_env},
                    num_replicas=world,
                    max_retries=max_retries,
                    resource=Resource(
                        cpu=_per_proc(node.cpu, nproc),
                        gpu=_per_proc(node.gpu, nproc),
                        memMB=_per_proc(node.memMB, nproc),
                    ),
                    metadata={PROCS_PER_NODE: nproc},
                )
            ],
        )
    # Not --standalone for one node: it replaces the run id with a random one, and
    # the workers' TORCHELASTIC_RUN_ID would no longer name the app.
    rdzv = [
        "--rdzv_backend=c10d",
        '--rdzv_endpoint="$$MASTER_ADDR:$$MASTER_PORT"',
        f"--rdzv_id={macros.app_id}",
    ]
    torchrun = [
        shlex.quote(interpreter),
        "-m torch.distributed.run",
        f"--nnodes={nnodes}",
        f"--nproc_per_node={nproc}",
        f"--max_restarts={max_retries}",
        f"--role={role}",
        *rdzv,
        shlex.join([*target, *args]),
    ]
    return AppDef(
        name=name or role,
        roles=[
            Role(
                name=role,
                entrypoint="sh",
                args=["-c", f"{prelude} exec {' '.join(torchrun)}"],
                image=image,
                env={**TORCHRUN_ENV, **base_env},
                num_replicas=nnodes,
                max_retries=max_retries,
                resource=node,
            )
        ],
    )


def _port_expr(port: str, interpreter: str) -> str:
    """The port, or (``0``) a shell expression deriving one from the app id, same on every node.

    The job's interpreter computes it: it is in every image that can run the job,
    where a shell tool is not (busybox images may have no ``cksum``).
    """
    if port != "0":
        return port
    low, span = _PORT_RANGE
    code = f"import sys, zlib; print({low} + zlib.crc32(sys.argv[1].encode()) % {span})"
    return f'$$({shlex.quote(interpreter)} -c {shlex.quote(code)} "{macros.app_id}")'
