"""The first verb to touch a backend imports its modules in a worker thread, not on the loop.

Backends are imported when first used, so a Supervisor that never runs Slurm
never loads it. That import reads and runs the backend's modules, and it used
to run inside the first ``submit``, ``list`` or ``describe``, holding the host's
event loop: the first local submit's longest step on the loop was 44-71 ms here
(bytecode cached), 12-19 ms with the import in a thread.
Each probe runs in a fresh interpreter, where the backend is not imported yet;
it notes which thread executes the backend's module.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]

PROBE = r"""
import importlib.abc, json, sys, tempfile, threading
from pathlib import Path
import anyio
from supervisor import AppDef, AppState, Role, Supervisor

MODULE = "supervisor.backends.local.backend"
threads = []

class NoteThread(importlib.abc.MetaPathFinder):
    # Finds nothing itself: it only notes the thread that asks for the module.
    def find_spec(self, name, path=None, target=None):
        if name == MODULE:
            threads.append(threading.current_thread() is threading.main_thread())
        return None

sys.meta_path.insert(0, NoteThread())

async def main(verb, state_dir):
    assert MODULE not in sys.modules
    async with Supervisor(session="imports", state_dir=state_dir) as sv:
        if verb == "submit":
            app = AppDef(name="one", roles=[Role(name="r", entrypoint="true")])
            state = (await sv.wait(await sv.submit(app, "local"), timeout=30)).state
            assert state is AppState.SUCCEEDED, state
        elif verb == "list":
            assert await sv.list("local") == []
        else:
            assert await sv.describe("local://imports/nothing-here") is None
    print(json.dumps({"on_main_thread": threads}))

with tempfile.TemporaryDirectory() as tmp:
    anyio.run(main, sys.argv[1], Path(tmp))
"""


@pytest.mark.parametrize("verb", ["submit", "list", "describe"])
def test_the_first_use_of_a_backend_imports_it_off_the_loop(verb: str) -> None:
    done = subprocess.run(
        [sys.executable, "-c", PROBE, verb],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout.strip().splitlines()[-1])
    # Imported once, and in a worker thread (a second lookup would come from sys.modules).
    assert found["on_main_thread"] == [False]
