"""Helpers for driving TorchX 0.7.0's local scheduler from the benchmarks.

Only imported in child processes running in ``bench/.venv`` (where TorchX is
installed); never by the driver or the report.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
from typing import Any

__all__ = ["quiet_torchx", "torchx_teardown"]


def quiet_torchx() -> None:
    """TorchX logs every launch at INFO; the benchmarks only want errors."""
    logging.basicConfig(level=logging.ERROR)
    logging.getLogger("torchx").setLevel(logging.ERROR)


def torchx_teardown(runner: Any) -> None:
    """Stop everything a Runner launched without TorchX's slow path (not measured).

    ``LocalScheduler.close`` kills each replica, then closes each replica's
    ``Tee`` one after another, and every close waits out that thread's 0.1 s
    sleep: about 50 s for 1,000 replicas. Teardown is not what the cases
    measure, so all Tee threads are told to stop first and joined together,
    then the Runner closes as usual.
    """
    tees: list[Any] = []
    for scheduler in getattr(runner, "_scheduler_instances", {}).values():
        for app in getattr(scheduler, "_apps", {}).values():
            for replicas in app.role_replicas.values():
                for replica in replicas:
                    if replica.proc.poll() is None:
                        with contextlib.suppress(OSError):
                            os.killpg(replica.proc.pid, signal.SIGKILL)
                        replica.proc.wait()
                    if replica.combined is not None and not replica.combined._closed:
                        tees.append(replica.combined)
    for tee in tees:
        tee._closed = True
    for tee in tees:
        tee.thread.join()
        with tee.streams_lock:
            for stream in tee.streams:
                stream.close()
            tee.out.close()
    runner.close()
