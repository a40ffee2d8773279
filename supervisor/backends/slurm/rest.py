"""How the backend talks to Slurm without its command-line tools: slurmrestd's REST API.

Written against OpenAPI ``v0.0.38`` (Slurm 22.05), the version whose
``/slurm/.../jobs`` and ``/slurmdb/.../jobs`` answers have the shapes
``squeue --json`` and ``sacct --json`` print on 22.05, so ``records.py``
parses both. What differs from the CLI, found against a real slurmrestd:

* ``job/submit`` ignores the script's ``#SBATCH`` lines: every job property
  must be sent as JSON, one object per het component (``jobs``). So the
  script's directives are parsed here, as sbatch would, into those objects;
  a directive this cannot translate is refused before anything is sent.
* Each component needs an ``environment`` (sbatch would send the caller's
  whole environment); see ``RestTransport.__init__``.
* Slurm errors come back as an ``errors`` array, mostly with HTTP 500, also
  for permanent mistakes (an unknown partition is 500 with error 2000), and
  sometimes with HTTP 200 (a held job, an accounting query that found
  nothing). Whether a retry may help is decided from the error codes and
  messages, not from the HTTP status alone.
* ``/slurmdb/.../jobs`` takes ``step=ID,ID,...`` (sacct's ``-j``): one call
  for every job that left the controller. Like ``sacct --json`` it returns
  every record with a matching id (each attempt of a requeued job, stale
  records left by a controller that lost its state); they are all returned,
  as the CLI transport does, for ``records.latest_per_component`` to pick.
* There is no requeue operation in v0.0.38. Holding and releasing is an
  update of the job (``POST job/{id}`` with ``hold``).
"""

from __future__ import annotations

import os
import pwd
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import anyio

from supervisor.backends.slurm.cluster import partition_from_json
from supervisor.backends.slurm.records import JobRecord, from_sacct, from_squeue
from supervisor.backends.slurm.script import ClusterFacts
from supervisor.backends.slurm.transport import AccountingDisabled, SlurmTransport, _transient
from supervisor.cluster import PartitionInfo
from supervisor.errors import BackendError, MissingExtraError, Problem, SpecError, SubmitError
from supervisor.observe import metrics

try:
    import httpx
except ModuleNotFoundError as e:  # the core install: the slurm-rest extra brings it
    raise MissingExtraError("slurm-rest", e.name or "httpx", what="Slurm over slurmrestd") from e

__all__ = ["DEFAULT_PATH", "RestTransport", "default_environment", "parse_batch_script"]

DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
"""The job's PATH when the submitting process has none."""
_PASSED_THROUGH = ("ASUPERVISOR_PYTHON",)  # read by the rendered script (the node's interpreter)

# Slurm error codes (slurm/slurm_errno.h, plus errno values) after which asking again may work:
# lost connections and timeouts to slurmctld or slurmdbd, a controller shutting down or in standby.
_TRANSIENT_CODES = frozenset(
    {
        4, 11, 104, 110, 111, 112, 113,  # EINTR, EAGAIN, ECONNRESET, ETIMEDOUT, ECONNREFUSED, ...
        *range(1001, 1005),  # SLURM_COMMUNICATIONS_{CONNECTION,SEND,RECEIVE,SHUTDOWN}_ERROR
        *range(1017, 1026),  # blocked on read/write, rejected, quiesce/connect/read/write timeouts
        *range(1800, 1806),  # SLURMCTLD_COMMUNICATIONS_* (controller unreachable, backoff)
        2027,  # ESLURM_IN_STANDBY_MODE
        5004, 5005,  # SLURM_PROTOCOL_SOCKET_IMPL_TIMEOUT, ..._ZERO_BYTES_SENT
        7000, 7008,  # ESLURM_DB_CONNECTION, ESLURM_DB_CONNECTION_INVALID
    }
)  # fmt: skip
# What slurmrestd 22.05 says both when slurmctld cannot be reached and when it rejects the JWT.
_AMBIGUOUS = frozenset({None, -1, 5005})
_EMPTY_RESULT = 9003  # ESLURM_REST_EMPTY_RESULT: "Nothing found with query"
_JOB_HELD = 2042  # ESLURM_JOB_HELD: a submission that worked, with the job held
_ACCOUNTING_OFF_HINTS = ("accounting storage is disabled", "not configured with slurmdbd")


@dataclass(frozen=True)
class _Option:
    key: str  # the job property slurmrestd v0.0.38 knows it by
    takes_value: bool = True
    bare: Any = True  # what a value-less use sends (optional-argument options: sbatch's default)


# sbatch's long options (and the short ones below) that slurmrestd v0.0.38 accepts as job
# properties, by the names its job_params table gives them (src/plugins/openapi/v0.0.38/jobs.c).
_LONG: dict[str, _Option] = {
    "account": _Option("account"),
    "acctg-freq": _Option("account_gather_frequency"),
    "array": _Option("array"),
    "batch": _Option("batch_features"),
    "bb": _Option("burst_buffer"),
    "begin": _Option("begin_time"),
    "chdir": _Option("current_working_directory"),
    "cluster-constraint": _Option("cluster_constraint"),
    "comment": _Option("comment"),
    "constraint": _Option("constraint"),
    "core-spec": _Option("core_specification"),
    "cores-per-socket": _Option("cores_per_socket"),
    "cpu-freq": _Option("cpu_frequency"),
    "cpus-per-gpu": _Option("cpus_per_gpu"),
    "cpus-per-task": _Option("cpus_per_task"),
    "deadline": _Option("deadline"),
    "delay-boot": _Option("delay_boot"),
    "dependency": _Option("dependency"),
    "distribution": _Option("distribution"),
    "error": _Option("standard_error"),
    "exclude": _Option("exclude_nodes"),
    "exclusive": _Option("exclusive", takes_value=False, bare="exclusive"),
    "gpu-bind": _Option("gpu_binding"),
    "gpu-freq": _Option("gpu_frequency"),
    "gpus": _Option("gpus"),
    "gpus-per-node": _Option("gpus_per_node"),
    "gpus-per-socket": _Option("gpus_per_socket"),
    "gpus-per-task": _Option("gpus_per_task"),
    "gres": _Option("gres"),
    "gres-flags": _Option("gres_flags"),
    "hint": _Option("cpu_binding_hint"),
    "hold": _Option("hold", takes_value=False),
    "input": _Option("standard_input"),
    "job-name": _Option("job_name"),
    "kill-on-invalid-dep": _Option("kill_on_invalid_dependency"),
    "licenses": _Option("licenses"),
    "mail-type": _Option("mail_type"),
    "mail-user": _Option("mail_user"),
    "mcs-label": _Option("mcs_label"),
    "mem": _Option("memory_per_node"),
    "mem-bind": _Option("memory_binding"),
    "mem-per-cpu": _Option("memory_per_cpu"),
    "mem-per-gpu": _Option("memory_per_gpu"),
    "mincpus": _Option("minimum_cpus_per_node"),
    "nice": _Option("nice", takes_value=False, bare="100"),
    "no-kill": _Option("no_kill", takes_value=False, bare="on"),
    "no-requeue": _Option("no_requeue", takes_value=False),
    "nodelist": _Option("nodelist"),
    "nodes": _Option("nodes"),
    "ntasks": _Option("ntasks"),
    "ntasks-per-core": _Option("ntasks_per_core"),
    "ntasks-per-gpu": _Option("ntasks_per_gpu"),
    "ntasks-per-node": _Option("ntasks_per_node"),
    "ntasks-per-socket": _Option("ntasks_per_socket"),
    "open-mode": _Option("open_mode"),
    "output": _Option("standard_output"),
    "partition": _Option("partition"),
    "priority": _Option("priority"),
    "profile": _Option("profile"),
    "qos": _Option("qos"),
    "requeue": _Option("requeue", takes_value=False),
    "reservation": _Option("reservation"),
    "signal": _Option("signal"),
    "sockets-per-node": _Option("sockets_per_node"),
    "spread-job": _Option("spread_job", takes_value=False),
    "thread-spec": _Option("thread_specification"),
    "threads-per-core": _Option("threads_per_core"),
    "time": _Option("time_limit"),
    "time-min": _Option("time_minimum"),
    "tmp": _Option("temporary_disk_per_node"),
    "umask": _Option("umask"),
    "use-min-nodes": _Option("minimum_nodes", takes_value=False),
    "wait-all-nodes": _Option("wait_all_nodes"),
    "wckey": _Option("wckey"),
}
_SHORT = {
    "A": "account", "a": "array", "b": "begin", "C": "constraint", "c": "cpus-per-task",
    "D": "chdir", "d": "dependency", "e": "error", "G": "gpus", "H": "hold", "i": "input",
    "J": "job-name", "k": "no-kill", "L": "licenses", "m": "distribution", "N": "nodes",
    "n": "ntasks", "o": "output", "p": "partition", "q": "qos", "S": "core-spec", "t": "time",
    "w": "nodelist", "x": "exclude",
}  # fmt: skip
_ALIASES = {"workdir": "chdir", "job_name": "job-name", "mem_per_cpu": "mem-per-cpu"}
_HET_SEPARATORS = ("hetjob", "packjob")
# What sbatch carries from one het component into the next unless that one sets it again
# (Slurm's heterogeneous_jobs page; checked against sbatch 22.05: --comment, --time, --mem,
# --job-name, --output, --chdir, --requeue... carry over; --cpus-per-task, --ntasks-per-node,
# --mem-per-cpu, --exclusive, --nodes, --spread-job, --mail-* do not).
_PROPAGATED = frozenset(
    {
        "account", "account_gather_frequency", "begin_time", "cluster_constraint", "comment",
        "current_working_directory", "deadline", "delay_boot", "dependency", "exclude_nodes",
        "hold", "job_name", "kill_on_invalid_dependency", "mcs_label", "memory_per_node", "nice",
        "no_kill", "no_requeue", "open_mode", "priority", "profile", "qos", "requeue",
        "reservation", "signal", "standard_error", "standard_input", "standard_output",
        "time_limit", "time_minimum", "wait_all_nodes", "wckey",
    }
)  # fmt: skip
# Properties that undo each other: setting one drops the other (``requeue: false`` is ignored).
_OPPOSITES = {"requeue": "no_requeue", "no_requeue": "requeue"}


def parse_batch_script(script: str) -> list[dict[str, Any]]:
    """The job properties of each het component, from the script's ``#SBATCH`` lines.

    Follows sbatch: directives are read until the first line that is neither
    blank nor a comment; ``#SBATCH hetjob`` starts the next component, which
    starts with the options sbatch propagates from the one before. An option
    slurmrestd cannot take (``--export``, ``--wrap``, ...) or that is unknown
    raises ``SubmitError`` naming it.
    """
    components: list[dict[str, Any]] = [{}]
    for number, line in enumerate(script.splitlines(), start=1):
        text = line.strip()
        if not text:
            continue
        if not text.startswith("#"):
            break
        if text != "#SBATCH" and not text.startswith(("#SBATCH ", "#SBATCH\t")):
            continue
        try:
            words = shlex.split(text[len("#SBATCH") :], comments=True)  # "#" ends it, as in sbatch
        except ValueError as e:
            raise SubmitError(f"script line {number}: {e}: {text}", transient=False) from e
        if words and words[0] in _HET_SEPARATORS:
            components.append({k: v for k, v in components[-1].items() if k in _PROPAGATED})
            words = words[1:]
        _apply_options(words, components[-1], number)
    return components


def _apply_options(words: list[str], into: dict[str, Any], number: int) -> None:
    i = 0
    while i < len(words):
        word = words[i]
        value: str | None = None
        if word.startswith("--"):
            name, eq, inline = word[2:].partition("=")
            value = inline if eq else None
        elif word.startswith("-") and len(word) > 1:
            name, inline = _SHORT.get(word[1], ""), word[2:]
            if not name:
                raise SubmitError(
                    f"script line {number}: sbatch option {word} is not supported over slurmrestd",
                    transient=False,
                )
            value = inline or None
        else:
            raise SubmitError(
                f"script line {number}: {word!r} is not an sbatch option", transient=False
            )
        option = _LONG.get(_ALIASES.get(name, name))
        if option is None:
            raise SubmitError(
                f"script line {number}: sbatch option --{name} is not supported over slurmrestd",
                transient=False,
            )
        i += 1
        if option.takes_value and value is None:
            if i >= len(words):
                raise SubmitError(f"script line {number}: --{name} needs a value", transient=False)
            value = words[i]
            i += 1
        into.pop(_OPPOSITES.get(option.key, ""), None)
        into[option.key] = option.bare if value is None else value


class _HttpError(BackendError):
    """slurmrestd answered with an HTTP error status or Slurm errors."""

    def __init__(self, message: str, *, status: int, transient: bool) -> None:
        super().__init__(message, transient=transient)
        self.status = status


class RestTransport(SlurmTransport):
    """slurmrestd over a unix socket (``rest_auth/local``) or HTTP with a JWT.

    Over the socket, slurmrestd acts as the user it runs as, so jobs run as
    that user (not as the caller): it must be able to enter the job's working
    directory and write its log directories. With ``token`` and ``user``
    every request carries ``X-SLURM-USER-NAME``/``X-SLURM-USER-TOKEN`` and
    jobs run as ``user``.

    ``environment`` is what each job starts with (sbatch would send the whole
    environment of the caller, which a service may not want to leak onto the
    nodes); ``default_environment()`` when not given.

    ``http_transport`` replaces the network (tests pass ``httpx.MockTransport``).
    """

    kind = "rest"

    queue_call = "jobs"
    accounting_call = "slurmdb_jobs"

    def __init__(
        self,
        *,
        socket: str | None = None,
        url: str | None = None,
        token: str | None = None,
        user: str | None = None,
        api_version: str = "v0.0.38",
        timeout: float = 30.0,
        environment: Mapping[str, str] | None = None,
        http_transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        super().__init__()
        problems = []
        if (socket is None) == (url is None):
            problems.append(Problem("socket", "give exactly one of socket and url"))
        if (token is None) != (user is None):
            problems.append(Problem("token", "a JWT needs both token and user"))
        if timeout <= 0:
            problems.append(Problem("timeout", f"{timeout} is not a positive number of seconds"))
        if problems:
            raise SpecError(problems, context="invalid slurmrestd settings")
        self.socket = socket
        self.url = url
        self.user = user
        self.api_version = api_version
        self.timeout = timeout
        self.environment: dict[str, str] = (
            dict(environment) if environment is not None else default_environment()
        )
        self._token = token
        self._http_transport = http_transport
        self._client: httpx.AsyncClient | None = None
        self._closed = False

    @property
    def where(self) -> str:
        return f"unix:{self.socket}" if self.socket is not None else str(self.url)

    def _new_client(self) -> httpx.AsyncClient:
        headers = {"Accept": "application/json"}
        if self._token is not None and self.user is not None:
            headers["X-SLURM-USER-NAME"] = self.user
            headers["X-SLURM-USER-TOKEN"] = self._token
        transport = self._http_transport
        if transport is None and self.socket is not None:
            transport = httpx.AsyncHTTPTransport(uds=self.socket)
        return httpx.AsyncClient(
            base_url=self.url or "http://slurmrestd",
            headers=headers,
            transport=transport,
            timeout=self.timeout,
        )

    async def aclose(self) -> None:
        """Close the connections kept for the next requests.

        Requests may still come (a closed Supervisor still answers ``status`` and
        ``describe`` of its apps): each then gets a connection of its own, closed
        once answered, so a closed transport keeps none open.
        """
        self._closed = True
        client, self._client = self._client, None
        if client is not None:
            await client.aclose()

    async def _send(
        self, method: str, path: str, params: Mapping[str, str] | None, body: Any
    ) -> httpx.Response:
        own = self._closed  # a client of its own, closed once answered (see ``aclose``)
        if own:
            client = self._new_client()
        else:
            client = self._client = self._client or self._new_client()
        try:
            return await client.request(method, path, params=params, json=body)
        finally:
            if own:
                # Closing only closes sockets; bounded all the same, as every request is.
                with anyio.move_on_after(self.timeout, shield=True):
                    await client.aclose()

    # ------------------------------------------------------------------ requests
    async def _request(
        self,
        name: str,
        method: str,
        path: str,
        *,
        params: Mapping[str, str] | None = None,
        body: Mapping[str, Any] | None = None,
        benign: frozenset[int] = frozenset(),
    ) -> dict[str, Any]:
        """One counted request; its JSON answer, or a ``BackendError``.

        Error codes in ``benign`` (in an answer that is otherwise a success)
        are not failures: the caller reads the answer.
        """
        self.calls[name] += 1
        metrics.count_slurm_call(self.kind, name)
        what = f"slurmrestd ({self.where}) {method} {path}"
        try:
            with anyio.fail_after(self.timeout):
                response = await self._send(method, path, params, body)
        except (TimeoutError, httpx.TimeoutException) as e:
            raise BackendError(
                f"{what} did not answer in {self.timeout:g} s", transient=True
            ) from e
        except httpx.UnsupportedProtocol as e:
            raise BackendError(f"{what}: {e}", transient=False) from e
        except httpx.TransportError as e:
            denied = isinstance(_root_cause(e), PermissionError)
            raise BackendError(
                f"{what} failed: {e or type(e).__name__}", transient=not denied
            ) from e
        status = response.status_code
        try:
            data = response.json()
        except ValueError:
            data = None
        if not isinstance(data, dict):
            text = response.text.strip()[:500]
            if status >= 400:
                if status == 404:
                    text += f" (does this slurmrestd serve API {self.api_version}?)"
                raise _HttpError(
                    f"{what} answered HTTP {status}: {text or response.reason_phrase}",
                    status=status,
                    transient=status >= 500 or status in (408, 429),
                )
            raise BackendError(f"{what} answered no JSON object: {text!r}", transient=True)
        errors = [e for e in data.get("errors") or [] if isinstance(e, Mapping)]
        failures = [e for e in errors if _code(e) not in benign]
        if status >= 400 or failures:
            shown = failures or errors
            message = "; ".join(_describe(e) for e in shown) or response.reason_phrase
            if any(_accounting_off(_describe(e)) for e in shown):
                raise AccountingDisabled(f"{what}: {message}")
            if self._token is not None and all(_code(e) in _AMBIGUOUS for e in shown):
                message += (
                    " (if this lasts, check the JWT: slurmctld answers a token it rejects "
                    "by dropping the connection)"
                )
            raise _HttpError(
                f"{what} failed (HTTP {status}): {message}",
                status=status,
                transient=_transient_answer(status, shown),
            )
        return data

    def _path(self, area: str, rest: str) -> str:
        return f"/{area}/{self.api_version}/{rest}"

    # ------------------------------------------------------------------ operations
    def submission(self, script: str, workdir: str) -> dict[str, Any]:
        """The ``job/submit`` body for ``sbatch --parsable --chdir=workdir < script``.

        As with sbatch, the command line's ``--chdir`` applies to every het
        component (over the script's own), and a job the script leaves
        unnamed is called "sbatch".
        """
        components = parse_batch_script(script)
        for component in components:
            component["current_working_directory"] = workdir
            component.setdefault("job_name", "sbatch")
            component["environment"] = dict(self.environment)
        if len(components) == 1:
            return {"script": script, "job": components[0]}
        return {"script": script, "jobs": components}

    async def submit(self, script: str, workdir: str) -> int:
        body = self.submission(script, workdir)
        try:
            data = await self._request(
                "submit",
                "POST",
                self._path("slurm", "job/submit"),
                body=body,
                benign=frozenset({_JOB_HELD}),
            )
        except BackendError as e:
            if isinstance(e.__cause__, (TimeoutError, httpx.TimeoutException)):
                raise BackendError(f"{e}; the job may exist", transient=True) from e
            raise SubmitError(str(e), transient=e.transient) from e
        job_id = data.get("job_id")
        if isinstance(job_id, bool) or not isinstance(job_id, int) or job_id <= 0:
            raise SubmitError(
                f"slurmrestd ({self.where}) returned no job id: {data!r}"[:500], transient=False
            )
        return job_id

    async def queue(self) -> list[JobRecord]:
        data = await self._request("jobs", "GET", self._path("slurm", "jobs"))
        return [from_squeue(j) for j in _dicts(data.get("jobs"))]

    async def accounting(self, job_ids: Sequence[int]) -> list[JobRecord]:
        if not job_ids:
            return []
        wanted = {int(i) for i in job_ids}
        params = {"step": ",".join(str(i) for i in sorted(wanted)), "skip_steps": "true"}
        try:
            data = await self._request(
                "slurmdb_jobs",
                "GET",
                self._path("slurmdb", "jobs"),
                params=params,
                benign=frozenset({_EMPTY_RESULT}),
            )
        except _HttpError as e:
            if e.status == 404:
                raise AccountingDisabled(
                    f"slurmrestd ({self.where}) serves no /slurmdb/{self.api_version} endpoints: "
                    "the cluster keeps no accounting (or slurmrestd runs without the "
                    f"openapi/db{self.api_version} plugin)"
                ) from e
            raise
        records = [from_sacct(j) for j in _dicts(data.get("jobs"))]
        return [r for r in records if r.job_id in wanted or r.het_job_id in wanted]

    async def cancel(self, job_id: int) -> None:
        await self._request("cancel", "DELETE", self._path("slurm", f"job/{int(job_id)}"))

    async def hold(self, job_id: int) -> None:
        """``POST job/{id}`` with ``hold: true``: an admin hold (JobHeldAdmin) when the
        job's user is root or an operator (slurmrestd v0.0.38 has no user hold), else
        JobHeldUser; ``release`` lifts either."""
        await self._request(
            "hold", "POST", self._path("slurm", f"job/{int(job_id)}"), body={"hold": True}
        )

    async def release(self, job_id: int) -> None:
        await self._request(
            "release", "POST", self._path("slurm", f"job/{int(job_id)}"), body={"hold": False}
        )

    async def requeue(self, job_id: int) -> None:
        raise BackendError(
            f"cannot requeue job {job_id}: slurmrestd {self.api_version} has no requeue "
            "operation (use `scontrol requeue`, or requeue from inside the job)",
            transient=False,
        )

    async def launch_failure_hint(self, workdir: str, app_dir: str) -> str:
        if self.socket is None or self._token is not None:
            return ""
        user = await anyio.to_thread.run_sync(_owner, self.socket)
        return (
            f"jobs sent over the socket {self.socket} (rest_auth/local) run as slurmrestd's "
            f"own user {user}, who must be able to enter {workdir} and write to {app_dir}"
        )

    async def ping(self) -> list[dict[str, Any]]:
        """The controllers' answers to ``/ping`` (``hostname``, ``ping`` "UP", ``mode``)."""
        data = await self._request("ping", "GET", self._path("slurm", "ping"))
        return _dicts(data.get("pings"))

    async def version_text(self) -> str:
        data = await self._request("ping", "GET", self._path("slurm", "ping"))
        meta = data.get("meta")
        found = meta.get("Slurm", {}) if isinstance(meta, Mapping) else {}
        release = found.get("release") if isinstance(found, Mapping) else None
        return str(release or "")

    async def node_list(self) -> list[dict[str, Any]]:
        data = await self._request("nodes", "GET", self._path("slurm", "nodes"))
        return _dicts(data.get("nodes"))

    async def partition_list(self) -> list[PartitionInfo]:
        data = await self._request("partitions", "GET", self._path("slurm", "partitions"))
        return [partition_from_json(p) for p in _dicts(data.get("partitions"))]

    async def job_list(self) -> list[dict[str, Any]]:
        data = await self._request("jobs", "GET", self._path("slurm", "jobs"))
        return _dicts(data.get("jobs"))

    async def facts(self) -> ClusterFacts:
        partitions = await self._request("partitions", "GET", self._path("slurm", "partitions"))
        nodes = await self._request("nodes", "GET", self._path("slurm", "nodes"))
        return facts_from_rest(partitions, nodes)


def default_environment() -> dict[str, str]:
    """The caller's ``PATH`` (and ``ASUPERVISOR_PYTHON`` if set), nothing else.

    ``PATH`` so that ``srun``, ``scontrol``, ``python3`` and the programs the
    script names resolve as they would under sbatch; ``ASUPERVISOR_PYTHON``
    because the rendered script reads it. Slurm adds its ``SLURM_*``
    variables and the script passes each replica's own explicitly. ``HOME``
    and ``USER`` are left out on purpose: the job may run as another user
    than the caller (always so over a ``rest_auth/local`` socket).
    """
    environment = {"PATH": os.environ.get("PATH") or DEFAULT_PATH}
    for name in _PASSED_THROUGH:
        if os.environ.get(name):
            environment[name] = os.environ[name]
    return environment


def facts_from_rest(partitions: Mapping[str, Any], nodes: Mapping[str, Any]) -> ClusterFacts:
    """The same facts as ``parse_facts`` from sinfo: version, default partition, memory per node.

    The version is in every answer's ``meta``; a partition's memory is the
    smallest ``real_memory`` of its nodes (MB), as sinfo's ``%m`` gives it.
    """
    version = (0, 0)
    for answer in (partitions, nodes):
        meta = answer.get("meta")
        found = meta.get("Slurm", {}).get("version") if isinstance(meta, Mapping) else None
        if isinstance(found, Mapping):
            major, minor = found.get("major"), found.get("minor")
            if isinstance(major, int) and isinstance(minor, int):
                version = (major, minor)
                break
    default = None
    for partition in _dicts(partitions.get("partitions")):
        flags = partition.get("flags") or []
        if isinstance(flags, list) and "default" in (str(f).lower() for f in flags):
            default = str(partition.get("name"))
    memory: dict[str, int] = {}
    for node in _dicts(nodes.get("nodes")):
        value = node.get("real_memory")
        if isinstance(value, bool) or not isinstance(value, int):
            continue
        for name in node.get("partitions") or []:
            memory[str(name)] = min(value, memory.get(str(name), value))
    return ClusterFacts(version=version, default_partition=default, real_memory_mb=memory)


def _owner(path: str) -> str:
    """The user owning ``path`` (slurmrestd's own user, for its socket)."""
    try:
        uid = os.stat(path).st_uid
    except OSError:
        return "(unknown: the socket cannot be read)"
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


def _dicts(value: Any) -> list[dict[str, Any]]:
    return [v for v in value if isinstance(v, dict)] if isinstance(value, list) else []


def _code(error: Mapping[str, Any]) -> int | None:
    for key in ("error_code", "error_number", "errno"):
        value = error.get(key)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None


def _describe(error: Mapping[str, Any]) -> str:
    parts = [str(error[k]) for k in ("description", "error") if error.get(k)]
    if len(parts) == 2 and parts[0] == parts[1]:
        parts = parts[:1]
    code = _code(error)
    text = ": ".join(parts) or "unspecified error"
    return f"{text} (error {code})" if code not in (None, -1) else text


def _transient_answer(status: int, errors: Sequence[Mapping[str, Any]]) -> bool:
    """May asking again help, after this HTTP status with these Slurm errors?

    A transient code or message anywhere says yes. Otherwise a specific Slurm
    code says no (slurmrestd answers 500 to an unknown partition too). Only
    errors without a code (-1, "Unspecified error") leave it to the status:
    slurmrestd gives those for an unreachable controller, and alas also for a
    JWT slurmctld rejects, on the calls that read the controller's state.
    """
    if any(_code(e) in _TRANSIENT_CODES or _transient(_describe(e)) for e in errors):
        return True
    if status < 500 or any((_code(e) or -1) > 0 for e in errors):
        return status in (408, 429)
    return True


def _accounting_off(text: str) -> bool:
    lowered = text.lower()
    return any(hint in lowered for hint in _ACCOUNTING_OFF_HINTS)


def _root_cause(error: BaseException) -> BaseException:
    seen = {id(error)}
    while (cause := error.__cause__ or error.__context__) is not None and id(cause) not in seen:
        seen.add(id(cause))
        error = cause
    return error
