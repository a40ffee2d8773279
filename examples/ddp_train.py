"""A tiny real DDP training run (gloo, CPU): what ``asupervisor run ddp`` is tested with.

Trains a linear model on fixed data for a few steps under
``DistributedDataParallel``; every rank must end with identical weights
(the all-reduce worked) and rank 0 prints them. ``--crash-rank R`` makes
rank R raise (recorded in its TORCHELASTIC_ERROR_FILE, as torchrun's
``@record`` would) unless ``--crash-until-attempt N`` lets attempt >= N pass,
so a retry can succeed.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel


def _record(exc: BaseException) -> None:
    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if not path:
        return
    message = {
        "message": {
            "message": f"{type(exc).__name__}: {exc}",
            "extraInfo": {
                "py_callstack": traceback.format_exc(),
                "timestamp": str(int(time.time())),
            },
        }
    }
    with open(path, "w") as f:
        json.dump(message, f)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--crash-rank", type=int, default=-1)
    parser.add_argument("--crash-until-attempt", type=int, default=1 << 30)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    if rank == args.crash_rank and attempt < args.crash_until_attempt:
        raise RuntimeError(f"rank {rank} crashed on purpose (attempt {attempt})")
    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.arange(8 * 4, dtype=torch.float32).reshape(8, 4) / 32 + rank
    y = x.sum(dim=1, keepdim=True)
    for _ in range(args.steps):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
    weights = torch.cat([p.detach().flatten() for p in model.parameters()])
    gathered = [torch.zeros_like(weights) for _ in range(world)]
    dist.all_gather(gathered, weights)
    same = all(torch.equal(g, gathered[0]) for g in gathered)
    # One write per line: torchrun's workers share one stdout (and run with -u), and
    # print's separate write of the newline let two ranks' lines run together.
    sys.stdout.write(
        f"rank {rank}/{world} local_rank {os.environ.get('LOCAL_RANK')} "
        f"host {os.environ.get('MASTER_ADDR')}:{os.environ.get('MASTER_PORT')} "
        f"loss {loss.item():.4f} in_sync {same} restart {attempt} "
        f"node {os.environ.get('SLURMD_NODENAME', '-')} "
        f"run {os.environ.get('TORCHELASTIC_RUN_ID', '-')}\n"
    )
    sys.stdout.flush()
    # Everyone done talking before anyone tears down (gloo aborts a rank whose peer left first).
    dist.barrier()
    dist.destroy_process_group()
    # Leave without the interpreter's shutdown. With torch 2.13, DDP keeps the process
    # group alive past destroy_process_group, so its gloo threads are never joined, and
    # one may drop the last collectives' tensors only after Python began to shut down:
    # that takes the GIL, Python ends the thread (pthread_exit) and the C++ runtime
    # aborts the rank ("terminate called without an active exception", SIGABRT) after
    # it trained. Seen in about 1 run of 15 under load (core dump: ProcessGroupGloo::
    # runLoop -> ~AsyncBarrierWork -> ~AsyncAllgatherWork -> decref_pyobject -> take_gil).
    sys.stderr.flush()  # stdout was flushed with the result line
    os._exit(0 if same else 2)


if __name__ == "__main__":
    try:
        main()
    except Exception as exc:
        _record(exc)
        raise
