"""Stand-ins for squeue, sacct and scancel that lie about ONE job id and pass the rest through.

For faults the real cluster cannot produce without hurting everyone on it: a controller
that forgot a job (killing slurmctld's state would forget every other user's jobs too), or
that reused a job id for an unrelated job. Put the directory first on PATH and write
``JOBID forget`` or ``JOBID reuse`` to its ``mode`` file; every other job, and every call
while ``mode`` is empty, goes to the real command unchanged.
"""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

_TOOL = r"""#!{python}
import json, os, subprocess, sys
HERE = os.path.dirname(os.path.abspath(__file__))
TOOL = os.path.basename(__file__)
REAL = "/usr/bin/" + TOOL
args = sys.argv[1:]
try:
    job, mode = open(os.path.join(HERE, "mode")).read().split()
    job = int(job)
except (OSError, ValueError):
    job, mode = None, ""
if TOOL == "scancel":
    with open(os.path.join(HERE, "scancel.log"), "a") as log:
        log.write(" ".join(args) + "\n")
    if mode == "reuse" and str(job) in args:
        sys.exit(0)  # "the other job" is not really there to cancel
    os.execv(REAL, [REAL, *args])
done = subprocess.run([REAL, *args], capture_output=True, text=True)
if job is None or "--json" not in args or done.returncode:
    sys.stdout.write(done.stdout)
    sys.stderr.write(done.stderr)
    sys.exit(done.returncode)
data = json.loads(done.stdout)
def mine(j):
    het = j.get("het_job_id") or (j.get("het") or {{}}).get("job_id") or j.get("job_id")
    return het == job
jobs = []
for j in data.get("jobs", []):
    if not mine(j):
        jobs.append(j)
    elif TOOL == "squeue" and mode == "forget":
        continue
    elif TOOL == "squeue" and mode == "reuse":
        jobs.append({{**j, "comment": "someone else's job", "name": "unrelated"}})
    elif TOOL == "sacct" and mode == "forget":
        jobs.append({{**j, "state": {{"current": "RUNNING", "reason": "None"}}}})
    else:
        jobs.append(j)
data["jobs"] = jobs
json.dump(data, sys.stdout)
"""


def install(directory: Path) -> Path:
    """Write the stand-ins into ``directory`` (made if needed); returns it, for PATH."""
    directory.mkdir(parents=True, exist_ok=True)
    for tool in ("squeue", "sacct", "scancel"):
        path = directory / tool
        path.write_text(_TOOL.format(python=sys.executable))
        path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    (directory / "mode").write_text("")
    return directory


def lie_about(directory: Path, job_id: int, mode: str) -> None:
    (directory / "mode").write_text(f"{job_id} {mode}" if mode else "")


def cancels(directory: Path) -> list[str]:
    log = directory / "scancel.log"
    return log.read_text().splitlines() if log.exists() else []


def path_with(directory: Path) -> str:
    return f"{directory}{os.pathsep}{os.environ.get('PATH', '')}"
