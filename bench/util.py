"""What every case shares: statistics, child processes, CPU and memory probes, machine facts.

Each case runs its measurements in child processes (``python -m bench.case_x
--impl ... --out result.json``) so that one implementation's threads, file
descriptors and peak RSS never leak into another's figures. Every process a
child starts inherits ``ASUPERVISOR_BENCH_TAG``; whatever still carries the tag
after the child ended is killed (see ``kill_tagged``), so an interrupted run
leaves no replica behind.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import resource
import secrets
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

import anyio

REPO = Path(__file__).resolve().parent.parent
TAG_ENV = "ASUPERVISOR_BENCH_TAG"
KEPT_SCRATCH_ENV = "ASUPERVISOR_BENCH_SCRATCH"
"""Set by the driver (``kept_scratch``): the children's scratch directories go there and
stay until the whole run ends."""
CLK_TCK = os.sysconf("SC_CLK_TCK")

Json = dict[str, Any]

# A replica that sleeps until an absolute deadline (microseconds since the
# epoch, $1) and appends the wall time at which it exits to the file $2. Only
# bash builtins around one `sleep`, so a thousand of them start quickly and the
# stamp is taken microseconds before the exit.
STAMP_SCRIPT = """\
now=${EPOCHREALTIME/./}
left=$(( $1 - now ))
if (( left > 0 )); then
    printf -v frac %06d $(( left % 1000000 ))
    sleep "$(( left / 1000000 )).$frac"
fi
echo "$EPOCHREALTIME" >> "$2"
"""


def log(message: str) -> None:
    """Progress on stderr, stamped with the wall clock."""
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------- statistics
def summarize(samples: Sequence[float]) -> Json:
    """Median, min and max of ``samples`` (and the samples themselves, for the record)."""
    values = [float(v) for v in samples]
    if not values:
        return {"n": 0, "median": None, "min": None, "max": None, "samples": []}
    return {
        "n": len(values),
        "median": statistics.median(values),
        "min": min(values),
        "max": max(values),
        "samples": values,
    }


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    if numerator is None or denominator is None or denominator == 0:
        return None
    return numerator / denominator


def median_of(row: Json | None, stat: str = "stats") -> float | None:
    """The median of a result row's ``stat`` summary, or None when the row failed or is missing."""
    if row is None:
        return None
    stats = row.get(stat)
    if not isinstance(stats, dict):
        return None
    value = stats.get("median")
    return float(value) if isinstance(value, int | float) else None


def add_ratios(rows: list[Json], baseline: str, key: str = "n", stat: str = "stats") -> None:
    """Give every row ``ratio_to_baseline`` (``{stat}_ratio_to_baseline`` for another summary
    than ``stats``): its median over the baseline's at the same ``key``."""
    out = "ratio_to_baseline" if stat == "stats" else f"{stat}_ratio_to_baseline"
    base = {row.get(key): median_of(row, stat) for row in rows if row.get("impl") == baseline}
    for row in rows:
        row[out] = ratio(median_of(row, stat), base.get(row.get(key)))


# -------------------------------------------------------------------- machine facts
def _meminfo_total_mib() -> float | None:
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) / 1024
    return None


def _cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(
            ["git", *args], cwd=REPO, capture_output=True, text=True, check=True, timeout=10
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip()


def _scratch_info() -> Json:
    """Where the children's temporary directories go, and what creating a file there costs.

    Every record and log the library writes is a file in such a directory, and
    a file system can get slow with age (on one long-lived VM, creating a file
    under /tmp went from tens of microseconds to 280 while a fresh directory on
    the same disk elsewhere stayed at 25): file-heavy figures are only
    comparable between runs whose scratch costs the same.
    """
    where = tempfile.gettempdir()
    samples: list[float] = []
    with tempfile.TemporaryDirectory(prefix="asv-bench-probe-") as probe:
        for i in range(200):
            started = time.perf_counter()
            fd = os.open(os.path.join(probe, str(i)), os.O_CREAT | os.O_WRONLY, 0o644)
            os.write(fd, b"x" * 100)
            os.close(fd)
            samples.append(time.perf_counter() - started)
    return {"dir": where, "file_create_us": round(statistics.median(samples) * 1e6, 1)}


def machine_info() -> Json:
    """Where and with what the figures were taken."""
    load = os.getloadavg()
    status = _git("status", "--porcelain")
    return {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "nproc": os.cpu_count(),
        "cpus_usable": len(os.sched_getaffinity(0)),
        "cpu_model": _cpu_model(),
        "memory_mib": _meminfo_total_mib(),
        "kernel": platform.release(),
        "os": _os_name(),
        "python": platform.python_version(),
        "loadavg_at_start": list(load),
        "nofile_hard_limit": resource.getrlimit(resource.RLIMIT_NOFILE)[1],
        "inotify_max_user_instances": _read_int("/proc/sys/fs/inotify/max_user_instances"),
        "scratch": _scratch_info(),
        "versions": {
            "asupervisor": _version("asupervisor"),
            "torchx": _version("torchx"),
            "anyio": _version("anyio"),
            "matplotlib": _version("matplotlib"),
        },
        "git_commit": _git("rev-parse", "--short", "HEAD"),
        "git_dirty": bool(status) if status is not None else None,
    }


def _os_name() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/etc/os-release").read_text().splitlines():
            if line.startswith("PRETTY_NAME="):
                return line.split("=", 1)[1].strip('"')
    return platform.system()


def _read_int(path: str) -> int | None:
    with contextlib.suppress(OSError, ValueError):
        return int(Path(path).read_text().strip())
    return None


# ------------------------------------------------------------------ process probes
def raise_nofile() -> int:
    """Lift the soft descriptor limit to the hard one (1,000 replicas need several thousand)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY:
        hard = 1 << 20
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def cpu_self() -> float:
    """User+system CPU seconds of this process, all its threads included."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def maxrss_kib() -> int:
    """Peak resident set size of this process, in KiB."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def children(pid: int | None = None) -> list[int]:
    """Direct children of ``pid`` (default: this process), across all its threads."""
    pid = os.getpid() if pid is None else pid
    found: list[int] = []
    with contextlib.suppress(OSError):
        for task in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError):
                text = Path(f"/proc/{pid}/task/{task}/children").read_text()
                found.extend(int(p) for p in text.split())
    return found


def comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def proc_cpu(pid: int) -> float:
    """User+system CPU seconds of a live process (all threads), from /proc (10 ms ticks)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0.0
    fields = stat.rsplit(")", 1)[1].split()
    # fields[0] is field 3 (state): utime and stime are fields 14 and 15.
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def helpers(exclude: frozenset[str]) -> list[int]:
    """This process's live children that are its helpers, not replicas.

    Replicas are excluded by their command name (``exclude``), and so is a
    child caught between fork and exec (same command line as its parent);
    what is left is the supervisor's own helpers (asupervisor's reaper).
    """
    mine = cmdline(os.getpid())
    return [
        pid for pid in children() if comm(pid) not in exclude and cmdline(pid) not in (mine, b"")
    ]


class HelperCpu:
    """CPU seconds of this process's helper children (asupervisor's reaper), from /proc.

    The supervising process's own CPU (``cpu_self``) leaves out its helper
    processes, and a helper that exits (with its Supervisor) takes its figures
    from /proc with it, while its reaped CPU would land in ``RUSAGE_CHILDREN``
    mixed with the replicas'. So the helpers are noted once they run
    (``find``), every reading is kept, and ``read`` sums each helper's latest
    (largest) one: read once more before the helpers end.
    """

    def __init__(self, exclude: frozenset[str]) -> None:
        self.exclude = exclude
        self.names: dict[int, str] = {}
        """pid -> command name of every helper noted so far."""
        self._cpu: dict[int, float] = {}

    def find(self) -> None:
        """Note the helpers alive now (call it after a first launch started them)."""
        for pid in helpers(self.exclude):
            self.names.setdefault(pid, comm(pid))

    def read(self) -> float:
        """Sum of the noted helpers' CPU seconds, refreshed from those still alive."""
        for pid in self.names:
            self._cpu[pid] = max(self._cpu.get(pid, 0.0), proc_cpu(pid))
        return self.last

    @property
    def last(self) -> float:
        """The sum as of the latest ``read``, without reading /proc again."""
        return sum(self._cpu.values())


async def bounded(count: int, in_flight: int, one: Callable[[int], Awaitable[None]]) -> None:
    """Await ``one(i)`` for every ``i`` in ``range(count)``, at most ``in_flight`` at a time.

    A task starts only once a slot is free, as a service that caps its
    submissions would do it: ``count`` tasks parked on a limiter from the start
    would add their own creation and scheduling to what a case measures.
    """
    slots = anyio.Semaphore(in_flight)

    async def run(i: int) -> None:
        try:
            await one(i)
        finally:
            slots.release()

    async with anyio.create_task_group() as tg:
        for i in range(count):
            await slots.acquire()
            tg.start_soon(run, i)


# ---------------------------------------------------------------- child processes
def child_parser(description: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--impl", required=True)
    parser.add_argument("--n", type=int, default=1)
    parser.add_argument("--reps", type=int, default=1)
    parser.add_argument("--out", type=Path, required=True)
    return parser


def write_json(path: Path, data: object) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=False) + "\n")
    tmp.replace(path)


def kill_tagged(tag: str) -> int:
    """SIGKILL every process whose environment carries ``ASUPERVISOR_BENCH_TAG=tag``."""
    marker = f"{TAG_ENV}={tag}".encode()
    killed = 0
    me = os.getpid()
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == me:
            continue
        try:
            environ = Path(f"/proc/{name}/environ").read_bytes()
        except OSError:
            continue
        if marker in environ.split(b"\0"):
            with contextlib.suppress(OSError):
                os.kill(int(name), signal.SIGKILL)
                killed += 1
    return killed


def run_child(module: str, args: Sequence[str], *, timeout: float) -> Json:
    """Run ``python -m bench.<module> ARGS --out F`` and return the JSON it wrote.

    On failure (exit status, timeout, no output) the result is
    ``{"error": ...}`` with the end of the child's stderr. Every process the
    child left behind is killed either way.
    """
    tag = secrets.token_hex(6)
    with tempfile.TemporaryDirectory(prefix="asv-bench-") as tmp:
        out = Path(tmp) / "result.json"
        err_path = Path(tmp) / "stderr.txt"
        env = {**os.environ, TAG_ENV: tag, "PYTHONPATH": str(REPO)}
        cmd = [sys.executable, "-m", f"bench.{module}", *args, "--out", str(out)]
        started = time.monotonic()
        with open(err_path, "wb") as err:
            proc = subprocess.Popen(
                cmd,
                cwd=REPO,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=err,
                stderr=err,
                start_new_session=True,
            )
            error: str | None = None
            try:
                code = proc.wait(timeout)
                if code != 0:
                    error = f"exit status {code}"
            except subprocess.TimeoutExpired:
                error = f"timed out after {timeout:.0f} s"
                _stop_group(proc)
            finally:
                if proc.poll() is None:
                    _stop_group(proc)
                leftovers = kill_tagged(tag)
        elapsed = time.monotonic() - started
        if error is None and not out.exists():
            error = "no result written"
        if error is not None:
            tail = err_path.read_text(errors="replace")[-2000:]
            log(f"  {module} {' '.join(args)}: {error}\n{tail}")
            return {"error": f"{error}: {_last_line(tail)}", "wall_s": elapsed}
        result: Json = json.loads(out.read_text())
        result["wall_s"] = elapsed
        if leftovers:
            result["leftover_processes_killed"] = leftovers
        return result


def run_rows(
    module: str, plan: dict[str, Any], fill: Callable[[Json, Json, int], None]
) -> list[Json]:
    """A row per ``(implementation, N, repetitions)`` of ``plan["runs"]``.

    ``fill(row, result, n)`` adds the case's figures from the children that
    succeeded. With ``plan["rounds"]`` (R > 1), each row's repetitions are
    split over R children (``rounds_of``), run in R rounds; in each round
    the rows of one N follow each other (``interleaved``). A ratio then
    divides figures taken seconds apart, R times over, not minutes apart,
    where a change in the machine's load may lie between them (one build
    gave 1.59x and 2.48x a Popen loop at N = 100 in two runs 20 minutes
    apart here). Such a case's children write ``{"samples": [...]}`` only; the
    row's result gathers them in round order.
    """
    runs = [tuple(run) for run in plan["runs"]]
    rounds = int(plan.get("rounds", 1))
    results: list[list[Json]] = [[] for _ in runs]
    for round_no in range(rounds):
        for at in interleaved(runs) if rounds > 1 else range(len(runs)):
            impl, n, reps = runs[at]
            share = rounds_of(reps, rounds)[round_no]
            if share:
                results[at].append(
                    run_child(
                        module,
                        ["--impl", impl, "--n", str(n), "--reps", str(share)],
                        timeout=plan.get("timeout_s", 900),
                    )
                )
    rows: list[Json] = []
    for (impl, n, reps), parts in zip(runs, results, strict=True):
        result = parts[0] if len(parts) == 1 else _gathered(parts)
        row: Json = {"impl": impl, "n": n, "reps": reps, "wall_s": result.get("wall_s")}
        if rounds > 1:
            row["children"] = len(parts)
        if "error" in result:
            row["error"] = result["error"]
        else:
            fill(row, result, n)
        rows.append(row)
    return rows


def rounds_of(reps: int, rounds: int) -> list[int]:
    """``reps`` repetitions over ``rounds`` children, the first ones taking the rest
    (5 over 3: 2, 2, 1); a round with no repetition left runs no child."""
    return [reps // rounds + (1 if k < reps % rounds else 0) for k in range(rounds)]


def interleaved(runs: Sequence[tuple[Any, ...]]) -> list[int]:
    """The indexes of ``runs`` ordered by N, the plan's order kept among those of one N."""
    return sorted(range(len(runs)), key=lambda at: int(runs[at][1]))


def _gathered(parts: list[Json]) -> Json:
    """The children of one row as one result: the first error, else every sample in order."""
    for part in parts:
        if "error" in part:
            return part
    walls = [part.get("wall_s") for part in parts]
    gathered: Json = {
        "samples": [sample for part in parts for sample in part["samples"]],
        "wall_s": sum(w for w in walls if isinstance(w, int | float)),
    }
    killed = sum(int(part.get("leftover_processes_killed", 0)) for part in parts)
    if killed:
        gathered["leftover_processes_killed"] = killed
    return gathered


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1][-300:] if lines else ""


def _stop_group(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(OSError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(OSError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


@contextlib.contextmanager
def scratch(prefix: str = "asv-bench-") -> Iterator[Path]:
    """A temporary directory for a child: inside the driver's ``kept_scratch`` (removed
    when the whole run ends), or of its own, removed afterwards even if replicas still
    write to it."""
    kept = os.environ.get(KEPT_SCRATCH_ENV)
    if kept:
        yield Path(tempfile.mkdtemp(prefix=prefix, dir=kept))
        return
    with tempfile.TemporaryDirectory(prefix=prefix, ignore_cleanup_errors=True) as tmp:
        yield Path(tmp)


@contextlib.contextmanager
def kept_scratch() -> Iterator[Path]:
    """One directory for every child's scratch, removed only once the run is over.

    A child's scratch holds thousands of files (records, logs, replica
    directories). Removed as the child ended, they made creating files slow
    for the children after it: on ext4 without a journal (this project's
    VMs) a new inode skips every one freed recently, for 5 s to minutes (see
    "Running" in docs/benchmarks.md). Each child's figures then depended on
    what the one before it removed.
    """
    root = Path(tempfile.mkdtemp(prefix="asv-bench-run-"))
    before = os.environ.get(KEPT_SCRATCH_ENV)
    os.environ[KEPT_SCRATCH_ENV] = str(root)
    try:
        yield root
    finally:
        if before is None:
            del os.environ[KEPT_SCRATCH_ENV]
        else:
            os.environ[KEPT_SCRATCH_ENV] = before
        shutil.rmtree(root, ignore_errors=True)


def write_stamp_script(directory: Path) -> Path:
    path = directory / "stamp_exit.sh"
    path.write_text(STAMP_SCRIPT)
    return path


def read_stamps(path: Path) -> list[float]:
    try:
        text = path.read_text()
    except FileNotFoundError:
        return []
    return [float(line) for line in text.split() if line]


def deadline_us(seconds_from_now: float) -> int:
    return int((time.time() + seconds_from_now) * 1_000_000)
