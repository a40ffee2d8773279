"""Run options of the ``slurm`` backend and the checks Slurm itself would make too late.

A bad ``--time`` or ``--mail-type`` otherwise surfaces as an sbatch error at
submission; checking here names the field before anything is sent.
"""

from __future__ import annotations

import re

from supervisor.errors import InvalidHandleError, Problem, SpecError
from supervisor.runopts import OptType, ResolvedCfg, RunOpt, RunOpts
from supervisor.specs import parse_handle

__all__ = [
    "DEPENDENCY_KINDS",
    "MAIL_TYPES",
    "check_slurm_cfg",
    "expand_hostlist",
    "mail_types",
    "slurm_run_opts",
    "valid_time",
]

DEPENDENCY_KINDS = ("after", "afterok", "afterany")
"""Run options naming apps this one waits for, each rendered as ``--dependency=KIND:ID[:ID]``."""

# Slurm's accepted time limit forms: minutes, minutes:seconds, hours:minutes:seconds,
# days-hours, days-hours:minutes, days-hours:minutes:seconds; plus the words below.
_TIME_FORMS = [
    re.compile(r"\d+"),
    re.compile(r"\d+:\d{1,2}"),
    re.compile(r"\d+:\d{1,2}:\d{1,2}"),
    re.compile(r"\d+-\d{1,2}"),
    re.compile(r"\d+-\d{1,2}:\d{1,2}"),
    re.compile(r"\d+-\d{1,2}:\d{1,2}:\d{1,2}"),
]
_TIME_WORDS = {"infinite", "unlimited"}
_NODE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
_HOSTLIST = re.compile(r"([A-Za-z0-9_.-]*)\[([0-9,-]+)\]([A-Za-z0-9_.-]*)")
_RANGE = re.compile(r"(\d+)(?:-(\d+))?")
# sbatch's --gres item: name[:type][:count] (e.g. gpu, gpu:2, gpu:a100:2, nvme:100G).
_GRES = re.compile(r"[A-Za-z][A-Za-z0-9_]*(:[A-Za-z0-9_.-]+)?(:\d+[KMGT]?)?")
# --gpus-per-node: [type:]count.
_GPUS = re.compile(r"(?:[A-Za-z0-9_.-]+:)?([0-9]+)")

MAIL_TYPES = frozenset(
    {
        "NONE", "BEGIN", "END", "FAIL", "REQUEUE", "ALL", "INVALID_DEPEND", "STAGE_OUT",
        "TIME_LIMIT", "TIME_LIMIT_90", "TIME_LIMIT_80", "TIME_LIMIT_50", "ARRAY_TASKS",
    }
)  # fmt: skip


def mail_types(value: str) -> list[str]:
    """The events of ``mail-type``, separated by ``,`` (sbatch's way, and a Python dict's)
    or ``;`` (the command line's: there ``,`` already separates run options)."""
    return [t.strip() for t in value.replace(";", ",").split(",") if t.strip()]


def valid_time(text: str) -> bool:
    return text.lower() in _TIME_WORDS or any(f.fullmatch(text) for f in _TIME_FORMS)


def expand_hostlist(text: str) -> list[str] | None:
    """``n[1-3,5]`` -> ``n1 n2 n3 n5`` (one bracket, as Slurm writes ranges); None if malformed."""
    if _NODE_NAME.fullmatch(text):
        return [text]
    found = _HOSTLIST.fullmatch(text)
    if found is None:
        return None
    prefix, ranges, suffix = found.groups()
    names: list[str] = []
    for part in ranges.split(","):
        bounds = _RANGE.fullmatch(part)
        if bounds is None:
            return None
        low, high = bounds.group(1), bounds.group(2) or bounds.group(1)
        if int(high) < int(low) or int(high) - int(low) > 10_000:
            return None
        width = len(low) if low.startswith("0") else 0  # n[01-03]: zero-padded, as Slurm does
        names += [f"{prefix}{i:0{width}d}{suffix}" for i in range(int(low), int(high) + 1)]
    return names


def slurm_run_opts() -> RunOpts:
    s, b, i, li = OptType.STR, OptType.BOOL, OptType.INT, OptType.LIST
    return RunOpts(
        [
            RunOpt("partition", s, None, "partition to run in (default: the cluster's default)"),
            RunOpt(
                "time",
                s,
                None,
                "time limit: minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS",
            ),
            RunOpt("comment", s, None, "free text shown by squeue and sacct"),
            RunOpt("constraint", s, None, "node features required (sbatch --constraint)"),
            RunOpt("mail-user", s, None, "who gets mail about the job"),
            RunOpt(
                "mail-type",
                s,
                None,
                "events to mail about (BEGIN, END, ...), separated by , or ; (--cfg: ;)",
            ),
            RunOpt("qos", s, None, "quality of service"),
            RunOpt("account", s, None, "account to charge"),
            RunOpt(
                "job_dir",
                s,
                None,
                "run in a fresh directory holding a snapshot of the working directory "
                "(files matched by .asupervisorignore are left out)",
            ),
            RunOpt(
                "log_dir",
                s,
                None,
                "where replica logs go: {log_dir}/{session}/{app_id}/{role}/{k} "
                "(default: <state dir>/logs); must be on a file system the nodes share",
            ),
            RunOpt("requeue_on_failure", b, True, "requeue the whole job while retries remain"),
            RunOpt(
                "nodelist",
                li,
                None,
                "nodes to run on (n1;n2 or n[1-2]), given in the order of the app's het groups "
                "(one per replica, or per grouped role): each group takes as many as it has "
                "nodes; groups left over run anywhere",
            ),
            RunOpt("exclude", li, None, "nodes never to run on (n3 or n[2-3])"),
            RunOpt("exclusive", b, False, "no other job shares a node with the app's replicas"),
            RunOpt("reservation", s, None, "run in this advance reservation"),
            RunOpt(
                "gres",
                li,
                None,
                "generic resources per node of each het group: name, name:count or "
                "name:type:count (gpu:a100:2); a gpu item replaces the request Resource.gpu makes",
            ),
            RunOpt(
                "gpus_per_node",
                s,
                None,
                "GPUs per node of each het group: count or type:count (a100:2); replaces "
                "the request Resource.gpu makes",
            ),
            RunOpt(
                "ntasks_per_node",
                i,
                None,
                "replicas of each role that share one node (one het group of "
                "num_replicas/N nodes per role, as ddp -j NxM does); a role's metadata "
                "asupervisor/procs_per_node overrides it for that role",
                minimum=1,
            ),
            *(
                RunOpt(
                    kind,
                    li,
                    None,
                    f"handles of slurm apps to wait for ({_DEPENDENCY_HELP[kind]}); "
                    "sbatch --dependency",
                )
                for kind in DEPENDENCY_KINDS
            ),
            RunOpt("hold", b, False, "submit held: it waits until `asupervisor release HANDLE`"),
            RunOpt(
                "image_is_tag",
                b,
                False,
                "a role's image is only a tag: nothing runs in a container (otherwise it is "
                "run with pyxis' srun --container-image, and a cluster without pyxis refuses it)",
            ),
            RunOpt(
                "allocation",
                s,
                None,
                "job id of a running allocation (salloc, or a running batch job) to run in: "
                "each replica is a job step of it (srun --overlap), nothing is queued; "
                "cli transport only",
            ),
        ],
        refused=_REFUSED,
    )


_DEPENDENCY_HELP = {
    "after": "start once each has started or was cancelled",
    "afterok": "start once each has succeeded; never runs if one fails",
    "afterany": "start once each has ended, however",
}


_NO_ENV_POLICY = (
    "a Slurm job's environment is set by the transport, not per app: sbatch (the cli "
    "transport) exports the submitting process's whole environment (--export=ALL), "
    "slurmrestd (rest) only PATH and ASUPERVISOR_PYTHON; each replica also gets its "
    "role's env (see docs/backends/slurm.md)"
)
#: Options of the local backend refused here, with why.
_REFUSED = {"env_policy": _NO_ENV_POLICY, "env_allow": _NO_ENV_POLICY}


def check_slurm_cfg(cfg: ResolvedCfg) -> None:
    problems: list[Problem] = []
    time = cfg.get_str("time")
    if time is not None and not valid_time(time):
        problems.append(
            Problem("cfg.time", f"{time!r} is not a Slurm time (e.g. 30, 1:30:00, 2-00:00:00)")
        )
    mail_type = cfg.get_str("mail-type")
    if mail_type is not None:
        unknown = [t for t in mail_types(mail_type) if t.upper() not in MAIL_TYPES]
        if unknown:
            problems.append(
                Problem(
                    "cfg.mail-type",
                    f"unknown {', '.join(map(repr, unknown))}; use {', '.join(sorted(MAIL_TYPES))}",
                )
            )
    problems += _check_placement(cfg)
    for key in ("comment", "mail-user", "job_dir", "log_dir"):
        value = cfg.get_str(key)
        if value is not None and any(not c.isprintable() for c in value):
            # A newline would end the #SBATCH line and start another one in the script.
            problems.append(
                Problem(f"cfg.{key}", f"{value!r} has a newline or other control character")
            )
    for key in ("partition", "qos", "account", "constraint", "reservation"):
        value = cfg.get_str(key)
        if value is not None and (not value or any(c.isspace() for c in value)):
            problems.append(Problem(f"cfg.{key}", f"{value!r} must be one word"))
    if problems:
        raise SpecError(problems, context="invalid run options")


def _check_placement(cfg: ResolvedCfg) -> list[Problem]:
    """Node names, GRES, GPUs and dependencies: the forms sbatch takes, checked before sending."""
    problems = []
    for key in ("nodelist", "exclude"):
        names: list[str] = []
        for item in cfg.get_list(key) or ():
            expanded = expand_hostlist(item)
            if expanded is None:
                problems.append(
                    Problem(f"cfg.{key}", f"{item!r} is not a node name or range (n1, n[1-3])")
                )
            else:
                names += expanded
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            problems.append(Problem(f"cfg.{key}", f"names {', '.join(twice)} more than once"))
    for item in cfg.get_list("gres") or ():
        if not _GRES.fullmatch(item):
            problems.append(
                Problem("cfg.gres", f"{item!r} is not name[:type][:count] (e.g. gpu:a100:2)")
            )
    gpus = cfg.get_str("gpus_per_node")
    if gpus is not None:
        count = _GPUS.fullmatch(gpus)
        if count is None or int(count.group(1)) < 1:
            problems.append(
                Problem("cfg.gpus_per_node", f"{gpus!r} is not [type:]count (e.g. a100:2 or 2)")
            )
    for kind in DEPENDENCY_KINDS:
        for item in cfg.get_list(kind) or ():
            try:
                handle = parse_handle(item)
            except InvalidHandleError as e:
                problems.append(Problem(f"cfg.{kind}", f"{item!r}: {e}"))
                continue
            if handle.backend != "slurm":
                problems.append(
                    Problem(f"cfg.{kind}", f"{item!r} is not a slurm app (Slurm waits on its own)")
                )
    return problems
