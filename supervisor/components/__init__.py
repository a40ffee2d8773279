"""Built-in components: functions that return an ``AppDef``.

A component is any function whose parameters describe an app and whose
return value is the ``AppDef``; the CLI turns its parameters into options
(``asupervisor run echo --msg hi``) and its docstring's first line into its
help. These are the ones that ship with asupervisor:

* ``echo``: print a message from each replica (a smoke test);
* ``sh``: run a shell snippet on each replica;
* ``ddp``: a torchrun-style data-parallel job for a Python script;
* ``mpi``: an MPI program over NNODES x NPROC ranks (Slurm: ``srun --mpi``, or mpirun).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType

from supervisor.components.basic import echo, sh, torchx_sh
from supervisor.components.dist import MASTER_PORT, ddp, parse_j
from supervisor.components.mpi import mpi
from supervisor.specs import AppDef

__all__ = ["BUILTINS", "MASTER_PORT", "TORCHX_NAMES", "ddp", "echo", "mpi", "parse_j", "sh"]

BUILTINS: Mapping[str, Callable[..., AppDef]] = MappingProxyType(
    {"echo": echo, "sh": sh, "ddp": ddp, "mpi": mpi}
)
"""Built-in components by the name the CLI knows them by."""

TORCHX_NAMES: Mapping[str, Callable[..., AppDef]] = MappingProxyType(
    {"utils.echo": echo, "utils.sh": torchx_sh, "dist.ddp": ddp}
)
"""The built-ins that stand in for TorchX's own, by TorchX's names, so its command lines
port: ``utils.sh`` quotes each argument as TorchX's does (``sh`` takes a script)."""
