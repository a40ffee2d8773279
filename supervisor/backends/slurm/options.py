"""Run options of the ``slurm`` backend and the checks Slurm itself would make too late.

A bad ``--time`` or ``--mail-type`` otherwise surfaces as an sbatch error at
submission; checking here names the field before anything is sent.
"""

from __future__ import annotations

import re

from supervisor.errors import Problem, SpecError
from supervisor.runopts import OptType, ResolvedCfg, RunOpt, RunOpts

__all__ = ["MAIL_TYPES", "check_slurm_cfg", "slurm_run_opts", "valid_time"]

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

MAIL_TYPES = frozenset(
    {
        "NONE", "BEGIN", "END", "FAIL", "REQUEUE", "ALL", "INVALID_DEPEND", "STAGE_OUT",
        "TIME_LIMIT", "TIME_LIMIT_90", "TIME_LIMIT_80", "TIME_LIMIT_50", "ARRAY_TASKS",
    }
)  # fmt: skip


def valid_time(text: str) -> bool:
    return text.lower() in _TIME_WORDS or any(f.fullmatch(text) for f in _TIME_FORMS)


def slurm_run_opts() -> RunOpts:
    s, b = OptType.STR, OptType.BOOL
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
            RunOpt("mail-type", s, None, "comma-separated events to mail about (BEGIN, END, ...)"),
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
        ],
        refused=_REFUSED,
    )


_NO_ENV_POLICY = (
    "a Slurm job's environment is set by the transport, not per app: sbatch (the cli "
    "transport) exports the submitting process's whole environment (--export=ALL), "
    "slurmrestd (rest) only PATH and ASUPERVISOR_PYTHON; each replica also gets its "
    "role's env (see docs/backends/slurm.md)"
)
#: Options of the local backend refused here, with why.
_REFUSED = {"env_policy": _NO_ENV_POLICY, "env_allow": _NO_ENV_POLICY}


def check_slurm_cfg(cfg: ResolvedCfg) -> None:
    problems = []
    time = cfg.get_str("time")
    if time is not None and not valid_time(time):
        problems.append(
            Problem("cfg.time", f"{time!r} is not a Slurm time (e.g. 30, 1:30:00, 2-00:00:00)")
        )
    mail_type = cfg.get_str("mail-type")
    if mail_type is not None:
        unknown = [t for t in mail_type.split(",") if t.strip().upper() not in MAIL_TYPES]
        if unknown:
            problems.append(
                Problem(
                    "cfg.mail-type",
                    f"unknown {', '.join(map(repr, unknown))}; use {', '.join(sorted(MAIL_TYPES))}",
                )
            )
    for key in ("partition", "qos", "account", "constraint"):
        value = cfg.get_str(key)
        if value is not None and (not value or any(c.isspace() for c in value)):
            problems.append(Problem(f"cfg.{key}", f"{value!r} must be one word"))
    if problems:
        raise SpecError(problems, context="invalid run options")
