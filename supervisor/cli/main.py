"""The ``asupervisor`` entry point: the command group and the query commands.

``run`` lives in ``runcmd.py``; exit codes are listed in ``supervisor.cli``'s
docstring and in ``codes.py``: 0 success/SUCCEEDED, 1 FAILED or no such app,
2 usage error, 3 CANCELLED, 4 UNKNOWN, 130 SIGINT, 143 SIGTERM.
"""

from __future__ import annotations

import logging
import re
from datetime import datetime
from pathlib import Path
from typing import Any

import click
from click.shell_completion import get_completion_class

from supervisor.cli import codes
from supervisor.cli.clusterview import (
    cluster_jobs_json,
    confirm_cancel,
    print_cluster,
    print_cluster_jobs,
    print_matches,
)
from supervisor.cli.errors import CliError, ExitOnBrokenPipe, UsageFailure, run_async
from supervisor.cli.follow import LogQuery, follow_logs
from supervisor.cli.options import backend_option
from supervisor.cli.render import (
    console,
    describe_json,
    echo_json,
    failure_line,
    list_json,
    print_describe,
    print_list,
    print_status,
    status_json,
    std_stream,
    use_color,
)
from supervisor.cli.runcmd import run
from supervisor.cli.timespec import TimeSpec, parse_duration
from supervisor.cluster import ClusterInfo
from supervisor.errors import InvalidHandleError, UnknownAppError, UnknownBackendError
from supervisor.logs import Stream
from supervisor.specs import parse_handle
from supervisor.states import AppState
from supervisor.status import AppStatus, DescribeAppResponse, ListAppResponse
from supervisor.supervisor import Supervisor, default_session

__all__ = ["cli", "main"]


class HandleType(click.ParamType[str]):
    """``backend://session/app_id``, checked with ``parse_handle`` (exit 2 if malformed).

    An empty session, ``backend:///app_id``, is the default one (``--session``,
    else ``$USER``, else the login name): ``local://$USER/app`` where ``$USER``
    is unset names the same app as the handle ``run`` printed.
    """

    name = "HANDLE"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        backend, sep, rest = str(value).partition(":///")
        if sep and backend and rest:
            obj = (ctx.find_root().obj if ctx is not None else None) or {}
            value = f"{backend}://{obj.get('session') or default_session()}/{rest}"
        try:
            return str(parse_handle(value))
        except InvalidHandleError as exc:
            self.fail(str(exc), param, ctx)


HANDLE = HandleType()
LOG_LEVELS = ("debug", "info", "warning", "error")


@click.group(cls=ExitOnBrokenPipe, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--session", help="session name for new apps (default: your user name)")
@click.option(
    "--state-dir",
    type=click.Path(file_okay=False, path_type=Path),
    help="where apps keep their records (default: $ASUPERVISOR_HOME, else "
    "$XDG_STATE_HOME/asupervisor, else ~/.local/state/asupervisor)",
)
@click.option(
    "--log-level",
    type=click.Choice(LOG_LEVELS, case_sensitive=False),
    envvar="ASUPERVISOR_LOG_LEVEL",
    help="print the library's log records (logger `supervisor`) at this level and above "
    "on stderr [env: ASUPERVISOR_LOG_LEVEL; default: warnings only]",
)
@click.version_option(package_name="asupervisor")
@click.pass_context
def cli(
    ctx: click.Context, session: str | None, state_dir: Path | None, log_level: str | None
) -> None:
    """Launch and follow multi-role, multi-replica apps.

    \b
    Exit codes: 0 success (the app SUCCEEDED, or is not over yet), 1 the app
    FAILED, no such app, or the backend failed, 2 usage error, 3 CANCELLED,
    4 UNKNOWN, 130 SIGINT, 143 SIGTERM. A non-zero code always comes with one
    line on stderr. `status` and `describe` exit as `run --wait` does.
    """
    if log_level is not None:
        _log_to_stderr(log_level)
    ctx.obj = {"session": session, "state_dir": state_dir}


def _log_to_stderr(level: str) -> None:
    """One handler on the library's logger; the root logger and others stay as they are."""
    handler = logging.StreamHandler(std_stream(stderr=True))
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logger = logging.getLogger("supervisor")
    logger.addHandler(handler)
    logger.setLevel(level.upper())


cli.add_command(run)


def _supervisor(ctx: click.Context) -> Supervisor:
    obj: dict[str, Any] = ctx.find_root().obj or {}
    return Supervisor(obj.get("session"), state_dir=obj.get("state_dir"))


async def _describe(sv: Supervisor, handle: str) -> DescribeAppResponse:
    found = await sv.describe(handle)
    if found is None:
        raise CliError(f"no app {handle}")
    return found


def _exit_for(ctx: click.Context, handle: str, status: AppStatus) -> None:
    """Exit as ``run --wait`` would for an app that ended; 0 while it has not."""
    if not status.is_settled:
        return
    code = codes.exit_code_for(status.state)
    if code != codes.OK:
        click.echo(f"Error: {failure_line(handle, status)}", err=True)
        ctx.exit(code)


def _show_status(
    ctx: click.Context, handle: str, found: DescribeAppResponse, as_json: bool
) -> None:
    """Print the app's status (``--json``: for programs) and exit as ``status`` does."""
    if as_json:
        echo_json(status_json(handle, found.to_status(), found.times))
    else:
        print_status(console(), handle, found.to_status(), found.times)
    _exit_for(ctx, handle, found.to_status())


@cli.command()
@click.argument("handle", type=HANDLE)
@click.option("--json", "as_json", is_flag=True, help="machine-readable output")
@click.pass_context
def status(ctx: click.Context, handle: str, as_json: bool) -> None:
    """State, times, restarts and per-replica status of an app.

    Exits as `run --wait` does once the app ended (1 FAILED, 3 CANCELLED,
    4 UNKNOWN), 0 while it has not ended or when it SUCCEEDED; 1 for no such app.
    """

    async def main() -> DescribeAppResponse:
        async with _supervisor(ctx) as sv:
            return await _describe(sv, handle)

    _show_status(ctx, handle, run_async(main), as_json)


@cli.command()
@click.argument("handle", type=HANDLE)
@click.option("--json", "as_json", is_flag=True, help="machine-readable output")
@click.pass_context
def describe(ctx: click.Context, handle: str, as_json: bool) -> None:
    """Status plus the app's roles: entrypoint, args, replicas, retries.

    Exit codes as for `status`.
    """

    async def main() -> DescribeAppResponse:
        async with _supervisor(ctx) as sv:
            return await _describe(sv, handle)

    found = run_async(main)
    if as_json:
        echo_json(describe_json(handle, found))
    else:
        print_describe(console(), handle, found)
    _exit_for(ctx, handle, found.to_status())


@cli.command()
@click.argument("handle", type=HANDLE)
@click.option("--json", "as_json", is_flag=True, help="machine-readable output")
@click.pass_context
def attach(ctx: click.Context, handle: str, as_json: bool) -> None:
    """Take over a Docker or Slurm app whose supervising process is gone; follow it to its end.

    This process becomes the app's owner: its retries and gang failure carry
    on until it ends, then its status is printed as by `status`. While its
    owner lives, this only waits for the end. Interrupted (Ctrl-C), it hands
    the app back: the app runs on. Exit codes as for `run --wait`.
    """

    async def main() -> DescribeAppResponse:
        async with _supervisor(ctx) as sv:
            try:
                await sv.attach(handle)
            except UnknownAppError as e:
                raise CliError(str(e)) from e
            await sv.wait(handle)
            return await _describe(sv, handle)

    _show_status(ctx, handle, run_async(main), as_json)


_REPLICA = re.compile(r"(?P<role>[^/]+)(?:/(?P<k>\d+))?")


def _select(resp: DescribeAppResponse, which: str | None) -> list[tuple[str, int]]:
    """The (role, k) pairs ``ROLE[/K]`` names; every replica when ``which`` is None."""
    known = {rs.role: [r.id for r in rs.replicas] for rs in resp.roles_statuses}
    for spec in resp.roles:
        known.setdefault(spec.name, list(range(spec.num_replicas)))
    if which is None:
        return [(role, k) for role, ids in known.items() for k in ids]
    found = _REPLICA.fullmatch(which)
    if found is None:
        raise click.BadParameter(f"{which!r} is not ROLE or ROLE/K", param_hint="ROLE[/K]")
    role = found["role"]
    if role not in known:
        raise click.BadParameter(
            f"no role {role!r}; roles: {', '.join(known)}", param_hint="ROLE[/K]"
        )
    if found["k"] is None:
        return [(role, k) for k in known[role]]
    k = int(found["k"])
    if k not in known[role]:
        raise click.BadParameter(
            f"role {role!r} has replicas {', '.join(map(str, known[role]))}; no {k}",
            param_hint="ROLE[/K]",
        )
    return [(role, k)]


async def _app_and_replica(
    sv: Supervisor, handle: str, replica: str | None
) -> tuple[str, DescribeAppResponse, str | None]:
    """The app and the ``ROLE[/K]`` that ``log``'s arguments name.

    Also TorchX's form, ``HANDLE/ROLE[/K]`` in one argument, when no app has
    that whole handle (an app id may contain '/', and an exact one wins).
    """
    tries = [(handle, replica)]
    if replica is None:
        head, _, last = handle.rpartition("/")
        if last.isdigit():  # HANDLE/ROLE/K, before HANDLE/ROLE with a role named K
            app, _, role = head.rpartition("/")
            tries.append((app, f"{role}/{last}"))
        tries.append((head, last))
    for app, which in tries:
        try:
            parse_handle(app)
        except InvalidHandleError:
            continue
        found = await sv.describe(app)
        if found is not None:
            return app, _with_replicas(app, found), which
    raise CliError(f"no app {handle}")


def _with_replicas(handle: str, found: DescribeAppResponse) -> DescribeAppResponse:
    """``found``, unless its record is too damaged to say which replicas it has: then the
    reason, rather than no lines and exit 0 (or "no role" for the role it does have)."""
    if not found.roles and not found.roles_statuses:
        raise CliError(f"cannot tell the replicas of {handle}: {found.msg or 'none recorded'}")
    return found


@cli.command()
@click.argument("handle", type=HANDLE)
@click.argument("replica", metavar="[ROLE[/K]]", required=False)
@click.option("-f", "--follow", is_flag=True, help="keep printing until the app ends")
@click.option("--regex", help="only lines matching this regular expression")
@click.option("--since", type=TimeSpec(), help="only lines written at or after T")
@click.option("--until", type=TimeSpec(), help="only lines written at or before T")
@click.option(
    "--streams",
    type=click.Choice([s.value for s in Stream]),
    help="which output [default: combined, both interleaved]",
)
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help='one {"role","replica_id","line"} per line, "line" without its line ending',
)
@click.pass_context
def log(
    ctx: click.Context,
    handle: str,
    replica: str | None,
    follow: bool,
    regex: str | None,
    since: float | None,
    until: float | None,
    streams: str | None,
    as_json: bool,
) -> None:
    """Print an app's output: every replica, one ROLE's, or one ROLE/K's.

    TorchX's HANDLE/ROLE[/K] in one argument works too. Lines are printed
    as written. Unless ROLE/K names one replica, each line starts with
    `role/k | `, an app of one replica too (as TorchX's `role/k `).
    T is an ISO-8601 datetime (naive means local time), epoch seconds, or a
    duration ago: 30s, 10m, 2h, 1d, 1h30m.
    """
    if regex is not None:
        try:
            re.compile(regex)
        except re.error as exc:
            raise click.BadParameter(str(exc), param_hint="--regex") from exc
    query = LogQuery(follow, regex, since, until, Stream(streams) if streams else None)

    async def main() -> None:
        async with _supervisor(ctx) as sv:
            app, described, which = await _app_and_replica(sv, handle, replica)
            replicas = _select(described, which)
            single = which is not None and "/" in which
            await follow_logs(
                sv,
                app,
                replicas,
                query,
                std_stream(),
                prefix=not single,
                color=use_color(std_stream()),
                as_json=as_json,
            )

    run_async(main)


@cli.command()
@click.argument("handle", type=HANDLE, required=False)
@click.option(
    "--state",
    "states",
    multiple=True,
    metavar="STATE",
    help="cancel this session's apps in this app state (PENDING, RUNNING, ...; repeatable)",
)
@click.option("--partition", help="cancel this session's apps whose Slurm job is in PARTITION")
@click.option("--all", "every", is_flag=True, help="cancel every app of this session not ended")
@backend_option(help="the backend whose apps --state/--partition/--all choose from")
@click.option("-y", "--yes", is_flag=True, help="cancel without asking")
@click.pass_context
def cancel(
    ctx: click.Context,
    handle: str | None,
    states: tuple[str, ...],
    partition: str | None,
    every: bool,
    backend: str,
    yes: bool,
) -> None:
    """Ask an app to stop, or this session's apps a filter chooses; returns at once.

    With HANDLE: exit 0 if the app exists (even finished), 1 if not. With
    --state, --partition (Slurm) or --all instead: only apps of this session
    (--session, default your user name) that have not ended, never another
    session's, nor a job asupervisor did not launch. They are listed, then
    cancelled once you confirm (--yes: without asking; with no terminal to ask
    on it refuses, exit 2). A "no" cancels nothing and exits 1 (`Error: nothing
    cancelled: ...`).
    """
    filtered = bool(states or partition is not None or every)
    if handle is not None and filtered:
        raise UsageFailure("give HANDLE or --state/--partition/--all, not both")
    if handle is None:
        if not filtered:
            raise UsageFailure("give HANDLE, or choose apps with --state, --partition or --all")
        _cancel_matching(ctx, backend, states, partition, yes)
        return

    async def main() -> None:
        async with _supervisor(ctx) as sv:
            found = await _describe(sv, handle)
            if found.to_status().is_terminal:
                click.echo(f"{handle} already ended: {found.state.name}", err=True)
                return
            await sv.cancel(handle)
        if found.state is AppState.UNKNOWN:
            # Its backend was asked all the same: what it did depends on why (a local app
            # whose owner died has nothing left to stop; a container behind an engine
            # that is away may still run).
            click.echo(f"cancel requested: {handle} (UNKNOWN: {found.msg})", err=True)
            return
        click.echo(f"cancel requested: {handle}", err=True)

    run_async(main)


def _cancel_matching(
    ctx: click.Context,
    backend: str,
    states: tuple[str, ...],
    partition: str | None,
    yes: bool,
) -> None:
    async def find() -> list[ListAppResponse]:
        async with _supervisor(ctx) as sv:
            return await sv.matching(backend, states=states, partition=partition)

    found = run_async(find)
    if not found:
        click.echo("no app of this session matches: nothing to cancel", err=True)
        return
    print_matches(console(stderr=True), found)
    confirm_cancel(len(found), yes)

    async def stop() -> None:
        async with _supervisor(ctx) as sv:
            for app in found:
                await sv.cancel(app.app_handle)
                click.echo(f"cancel requested: {app.app_handle}", err=True)

    run_async(stop)


@cli.command()
@click.argument("handle", type=HANDLE)
@click.pass_context
def hold(ctx: click.Context, handle: str) -> None:
    """Keep a pending Slurm app from starting (scontrol uhold); `release` lets it go.

    Its status stays PENDING with reason JobHeldUser. Exit 1 if there is no
    such app, 2 if its backend cannot hold apps.
    """
    _hold(ctx, handle, release=False)


@cli.command()
@click.argument("handle", type=HANDLE)
@click.pass_context
def release(ctx: click.Context, handle: str) -> None:
    """Let a held Slurm app start (scontrol release)."""
    _hold(ctx, handle, release=True)


def _hold(ctx: click.Context, handle: str, *, release: bool) -> None:
    async def main() -> None:
        async with _supervisor(ctx) as sv:
            await (sv.release(handle) if release else sv.hold(handle))
        click.echo(f"{'released' if release else 'held'}: {handle}", err=True)

    run_async(main)


STATE_NAMES = tuple(s.name for s in AppState)


@cli.command("list")
@backend_option()
@click.option(
    "--cluster",
    "whole_cluster",
    is_flag=True,
    help="every job the scheduler holds, anyone's (Slurm), ours marked with their handle",
)
@click.option("--user", help="with --cluster: only this user's jobs")
@click.option(
    "--state",
    "states",
    multiple=True,
    metavar="STATE",
    help="only this state (repeatable): an app state, or with --cluster a Slurm job state",
)
@click.option("--partition", help="with --cluster: only jobs in this partition")
@click.option(
    "--since",
    type=TimeSpec(),
    help="only apps submitted at or after: ISO-8601, epoch seconds, or a duration ago (2h)",
)
@click.option("--name", help="only apps of this AppDef name (shell wildcards * ? [] allowed)")
@click.option("--limit", type=click.IntRange(min=0), help="at most this many, the newest")
@click.option("--json", "as_json", is_flag=True, help="machine-readable output")
@click.pass_context
def list_apps(
    ctx: click.Context,
    backend: str,
    whole_cluster: bool,
    user: str | None,
    states: tuple[str, ...],
    partition: str | None,
    since: datetime | float | None,
    name: str | None,
    limit: int | None,
    as_json: bool,
) -> None:
    """Apps a backend knows, newest first: handle, name, state, times, and a msg where
    there is more to say.

    With --cluster (Slurm): every job the cluster holds, as squeue shows them,
    anyone's; the jobs of our apps show their handle.
    """
    if not whole_cluster and (user is not None or partition is not None):
        raise UsageFailure("--user and --partition filter the cluster's jobs: add --cluster")
    if whole_cluster and (since is not None or name is not None or limit is not None):
        raise UsageFailure("--since, --name and --limit filter the apps: not with --cluster")
    if not whole_cluster:
        unknown = [s for s in states if s.upper() not in STATE_NAMES]
        if unknown:
            raise UsageFailure(
                f"--state {unknown[0]!r} is not an app state ({', '.join(STATE_NAMES)})"
            )

    async def main() -> None:
        async with _supervisor(ctx) as sv:
            if whole_cluster:
                jobs = await sv.cluster_jobs(backend, user=user, states=states, partition=partition)
            else:
                apps = await sv.list(
                    backend, state=states or None, since=since, name=name, limit=limit
                )
        if whole_cluster:
            if as_json:
                echo_json(cluster_jobs_json(jobs))
            else:
                print_cluster_jobs(console(), jobs)
            return
        if as_json:
            echo_json(list_json(apps))
        else:
            print_list(console(), apps)

    run_async(main)


class DurationType(click.ParamType[float]):
    """``90s``, ``10m``, ``2h``, ``1d``, ``1h30m`` or bare seconds."""

    name = "DURATION"

    def convert(
        self, value: object, param: click.Parameter | None, ctx: click.Context | None
    ) -> float:
        if isinstance(value, (int, float)):
            return float(value)
        text = str(value).strip()
        seconds = parse_duration(text)
        if seconds is None and re.fullmatch(r"\d+(?:\.\d*)?", text):
            seconds = float(text)
        if seconds is None:
            self.fail(f"{value!r} is not a duration (90s, 10m, 2h, 1d)", param, ctx)
        return seconds


@cli.command()
@backend_option()
@click.option(
    "--older-than",
    type=DurationType(),
    help="remove settled apps that ended longer ago than this (2h, 7d)",
)
@click.option(
    "--keep", type=click.IntRange(min=0), help="keep only the N settled apps that ended last"
)
@click.option("--dry-run", is_flag=True, help="only print what would be removed")
@click.option("--json", "as_json", is_flag=True, help="machine-readable output")
@click.pass_context
def gc(
    ctx: click.Context,
    backend: str,
    older_than: float | None,
    keep: int | None,
    dry_run: bool,
    as_json: bool,
) -> None:
    """Remove the records and logs of the session's settled apps.

    Never removes an app that is not settled, or whose end is not recorded
    while its supervising process lives.
    """
    if older_than is None and keep is None:
        raise UsageFailure("give --older-than, --keep or both")

    async def main() -> None:
        async with _supervisor(ctx) as sv:
            removed = await sv.gc(backend, older_than=older_than, keep=keep, dry_run=dry_run)
        if as_json:
            echo_json({"dry_run": dry_run, "removed": removed})
            return
        verb = "would remove" if dry_run else "removed"
        for handle in removed:
            click.echo(f"{verb}: {handle}")
        click.echo(f"{verb} {len(removed)} app(s)", err=True)

    run_async(main)


@cli.command("cluster")
@backend_option(default="slurm")
@click.option("--partition", help="only this partition and its nodes")
@click.option("--json", "as_json", is_flag=True, help="machine-readable output")
@click.pass_context
def cluster_cmd(ctx: click.Context, backend: str, partition: str | None, as_json: bool) -> None:
    """The cluster's partitions and nodes, as sinfo shows them.

    Partitions: state, node count, CPUs, node list (`*` marks the default).
    Nodes: state, CPUs and memory (MB) allocated out of the total, GRES,
    partitions.
    """

    async def main() -> ClusterInfo:
        async with _supervisor(ctx) as sv:
            return await sv.cluster(backend, partition=partition)

    info = run_async(main)
    if as_json:
        echo_json(info.to_json())
    else:
        print_cluster(console(), info)


@cli.command()
@click.argument("backend")
@click.option("--json", "as_json", is_flag=True, help="machine-readable output")
@click.pass_context
def runopts(ctx: click.Context, backend: str, as_json: bool) -> None:
    """The run options BACKEND takes (`run --cfg k=v,...`)."""
    try:
        opts = _supervisor(ctx).run_opts(backend)
    except UnknownBackendError as exc:
        raise UsageFailure(str(exc)) from exc
    if as_json:
        echo_json(
            [
                {
                    "name": o.name,
                    "type": str(o.type),
                    "default": list(o.default) if isinstance(o.default, tuple) else o.default,
                    "required": o.required,
                    "help": o.help,
                }
                for o in opts
            ]
        )
    else:
        click.echo(str(opts))


SHELLS = ("bash", "zsh", "fish")


@cli.command()
@click.argument("shell", type=click.Choice(SHELLS))
def completion(shell: str) -> None:
    """Print the completion script for SHELL (bash, zsh or fish).

    \b
    bash:  eval "$(asupervisor completion bash)"     in ~/.bashrc
    zsh:   eval "$(asupervisor completion zsh)"      in ~/.zshrc
    fish:  asupervisor completion fish > ~/.config/fish/completions/asupervisor.fish
    """
    complete = get_completion_class(shell)
    assert complete is not None  # click ships all three
    click.echo(complete(cli, {}, "asupervisor", "_ASUPERVISOR_COMPLETE").source())


def main() -> None:
    """The console script."""
    cli.main(prog_name="asupervisor")


if __name__ == "__main__":
    main()
