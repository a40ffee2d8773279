"""Local apps followed under a plain ``asyncio.run``, as a FastAPI service runs them.

Replicas' pipes are read by callbacks of the loop, outside any task, where
anyio cannot start a task under a plain ``asyncio.run`` (it finds the event
loop from the current task; under ``anyio.run`` a context variable tells it).
Every kind of end must still be followed: one that needs no task (told at
once), an open last line, an error file to read, several replicas, a restart.
The host runs in a child process of its own, with real replicas.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

HOST = textwrap.dedent(
    """
    import asyncio, json, sys
    from supervisor import AppDef, Role, Supervisor

    async def main() -> None:
        flag = sys.argv[1]
        roles = {
            "silent": Role(name="r", entrypoint="sh", args=["-c", "exit 0"]),
            "open-line": Role(name="r", entrypoint="sh", args=["-c", "printf 'no newline'"]),
            "failed": Role(
                name="r", entrypoint="sh", args=["-c", "echo out; echo err >&2; exit 3"]
            ),
            "gang": Role(
                name="r", entrypoint="sh", args=["-c", "echo $REPLICA_ID; exit 0"],
                num_replicas=3, env={"REPLICA_ID": "x"},
            ),
            "retried": Role(
                name="r", entrypoint="sh",
                args=["-c", f"if [ -e {flag} ]; then exit 0; fi; : > {flag}; exit 5"],
                max_retries=1,
            ),
        }
        out = {}
        async with Supervisor(session="plain", state_dir=sys.argv[2]) as sv:
            handles = {k: await sv.submit(AppDef(name=k, roles=[r]), "local")
                       for k, r in roles.items()}
            for name, handle in handles.items():
                status = await sv.wait(handle, timeout=30)
                lines = [line.rstrip("\\n") async for line in sv.log_iter(handle, "r", 0)]
                out[name] = {
                    "state": status.state.name,
                    "codes": [r.exit_code for r in status.roles[0].replicas],
                    "restarts": status.num_restarts,
                    "lines": lines,
                }
        print(json.dumps(out), flush=True)

    asyncio.run(main())
    """
)


def test_exits_are_followed_under_a_plain_asyncio_run(tmp_path: Path) -> None:
    script = tmp_path / "host.py"
    script.write_text(HOST)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "failed-once"), str(tmp_path / "state")],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["silent"] == {"state": "SUCCEEDED", "codes": [0], "restarts": 0, "lines": []}
    assert out["open-line"]["state"] == "SUCCEEDED"
    assert out["open-line"]["lines"] == ["no newline"]
    assert out["failed"]["state"] == "FAILED"
    assert out["failed"]["codes"] == [3]
    assert sorted(out["failed"]["lines"]) == ["err", "out"]
    assert out["gang"]["state"] == "SUCCEEDED"
    assert out["gang"]["codes"] == [0, 0, 0]
    assert out["gang"]["lines"] == ["x"]
    assert out["retried"]["state"] == "SUCCEEDED"
    assert out["retried"]["restarts"] == 1
