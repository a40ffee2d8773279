"""Whether this cluster's ``srun`` runs containers (the pyxis SPANK plugin).

pyxis adds ``--container-image`` and its siblings to ``srun --help``; without
it a role's image cannot be run, and the dry run says so (naming
``roles[i].image``) instead of letting sbatch fail later, or the image be
silently ignored. Asked once per backend, off the event loop's thread (a
subprocess awaited through anyio).
"""

from __future__ import annotations

import anyio

__all__ = ["PROBE_TIMEOUT_S", "has_pyxis", "probe_pyxis"]

PROBE_TIMEOUT_S = 30.0


def has_pyxis(help_text: str) -> bool:
    """From ``srun --help``: pyxis lists ``--container-image`` there."""
    return "--container-image" in help_text


async def probe_pyxis(srun: str = "srun") -> bool | None:
    """True or False from ``srun --help``; None when srun cannot be asked (not known)."""
    try:
        with anyio.fail_after(PROBE_TIMEOUT_S):
            done = await anyio.run_process([srun, "--help"], check=False)
    except (OSError, TimeoutError):
        return None
    text = (done.stdout + done.stderr).decode(errors="replace")
    if done.returncode != 0 and not text.strip():
        return None
    return has_pyxis(text)
