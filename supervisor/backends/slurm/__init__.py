"""The ``slurm`` backend: one heterogeneous batch job per app on a real Slurm cluster."""

from supervisor.backends.slurm.backend import SlurmBackend
from supervisor.backends.slurm.poller import PollerSettings

__all__ = ["PollerSettings", "SlurmBackend"]
