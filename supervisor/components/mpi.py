"""``mpi``: an MPI program over NNODES x NPROC ranks, started by Slurm or by mpirun.

* ``plugin="pmix"`` or ``"pmi2"``: one ``srun --mpi=PLUGIN`` step; each rank is
  a replica of its own (state, logs, exit code), NPROC of them per node. Slurm
  wires the ranks up: Open MPI needs ``pmix``, MPICH ``pmi2`` (Debian's Open MPI
  has no PMI-2 support).
* ``plugin="mpirun"``: one replica running ``mpirun -np NNODES*NPROC PROGRAM``
  on the first node of an allocation of NNODES nodes x NPROC tasks; mpirun
  reads the allocation from Slurm and starts its daemons on the other nodes
  through Slurm itself. The ranks' output is that one replica's log.

The Slurm backend renders this from the role's metadata (:data:`MPI`,
:data:`MPI_NODES`, :data:`PROCS_PER_NODE`); other backends run the replicas
without a process manager, so it is meant for Slurm.
"""

from __future__ import annotations

from supervisor.components.dist import parse_j, role_name
from supervisor.specs import MPI, MPI_NODES, MPI_PLUGINS, PROCS_PER_NODE, AppDef, Resource, Role

__all__ = ["mpi"]


def mpi(
    *program: str,
    j: str = "1x2",
    plugin: str = "pmix",
    name: str | None = None,
    cpu: int = 1,
    memMB: int = -1,  # noqa: N803 (TorchX spells it so)
    env: dict[str, str] | None = None,
    max_retries: int = 0,
    mpirun: str = "mpirun",
    mpirun_args: str = "",
) -> AppDef:
    """Run an MPI program on NNODESxNPROC ranks (Slurm: srun --mpi=pmix|pmi2, or mpirun).

    ``asupervisor run -s slurm mpi -j 2x2 --plugin pmix ./hello`` starts four
    ranks, two on each of two nodes, as one ``srun --mpi=pmix`` step;
    ``--plugin mpirun`` runs ``mpirun -np 4 ./hello`` on the first node of the
    allocation instead.

    Args:
        program: the MPI program and its arguments
        j: NNODESxNPROC_PER_NODE, e.g. 2x4, or just NPROC for one node
        plugin: pmix or pmi2 (srun starts each rank), or mpirun
        name: the app's name (default: the program's name)
        cpu: CPUs per rank
        memMB: memory per rank in MB (-1: the partition's default)
        env: extra environment variables, k=v,k2=v2
        max_retries: restarts of the whole job after a failure
        mpirun: the mpirun to run (plugin mpirun), e.g. mpirun.openmpi
        mpirun_args: more arguments for mpirun, split at spaces (plugin mpirun)
    """
    nnodes, nproc = parse_j(j)
    if not program:
        raise ValueError("expected the MPI program to run (and its arguments)")
    if plugin not in MPI_PLUGINS:
        raise ValueError(f"--plugin {plugin!r}: expected one of {', '.join(MPI_PLUGINS)}")
    role = role_name(program[0], None)
    resource = Resource(cpu=cpu, gpu=0, memMB=memMB)
    if plugin == "mpirun":
        ranks = nnodes * nproc
        return AppDef(
            name=name or role,
            roles=[
                Role(
                    name=role,
                    entrypoint=mpirun,
                    args=["-np", str(ranks), *mpirun_args.split(), *program],
                    env=dict(env or {}),
                    num_replicas=1,
                    max_retries=max_retries,
                    resource=resource,
                    metadata={MPI: "mpirun", MPI_NODES: nnodes, PROCS_PER_NODE: nproc},
                )
            ],
        )
    return AppDef(
        name=name or role,
        roles=[
            Role(
                name=role,
                entrypoint=program[0],
                args=list(program[1:]),
                env=dict(env or {}),
                num_replicas=nnodes * nproc,
                max_retries=max_retries,
                resource=resource,
                metadata={MPI: plugin, PROCS_PER_NODE: nproc},
            )
        ],
    )
