"""A small distributed-training-shaped app: two trainers, a parameter server, an evaluator.

Every replica is a few lines of Python that print progress, so the demo runs
anywhere in a few seconds. Also usable as a CLI component:
``asupervisor run --wait --log examples/demo_app.py:demo``.
"""

from __future__ import annotations

import sys

from supervisor import AppDef, RetryPolicy, Role

TRAINER = """
import os, random, sys, time
rank = int(os.environ["ASUPERVISOR_REPLICA_ID"])
attempt = int(os.environ["ASUPERVISOR_ATTEMPT"])
if rank == 1 and attempt == 0:
    print("trainer 1: simulated crash on the first attempt", file=sys.stderr, flush=True)
    time.sleep(0.5)
    sys.exit(1)
for step in range(1, {steps} + 1):
    loss = 2.0 / step + random.random() * 0.05
    print(f"step {{step}} loss={{loss:.3f}}", flush=True)
    time.sleep(0.3)
print("done", flush=True)
"""

PS = """
import time
for i in range(4):
    print(f"parameter server: serving shard {i}", flush=True)
    time.sleep(0.5)
"""

EVALUATOR = """
import os, time
time.sleep(1.0)
print("evaluator: accuracy=0.91 on", os.environ["ASUPERVISOR_APP_ID"], flush=True)
"""


def demo(steps: int = 8) -> AppDef:
    """Two trainers (one crashes once and is restarted), a parameter server and an evaluator."""
    return AppDef(
        name="demo",
        roles=[
            Role(
                name="trainer",
                entrypoint=sys.executable,
                args=["-c", TRAINER.format(steps=steps)],
                num_replicas=2,
                max_retries=1,
                retry_policy=RetryPolicy.REPLICA,
            ),
            Role(name="ps", entrypoint=sys.executable, args=["-c", PS]),
            Role(name="evaluator", entrypoint=sys.executable, args=["-c", EVALUATOR]),
        ],
    )
