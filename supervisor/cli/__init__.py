"""The ``asupervisor`` command line.

Commands (``asupervisor COMMAND --help`` for each; ``-h`` works everywhere)::

    run [--backend B] [--cfg k=v,...] [--dryrun] [--wait] [--log] [--json] TARGET [ARGS...]
    status HANDLE [--json]
    describe HANDLE [--json]
    attach HANDLE [--json]
    log HANDLE [ROLE[/K]] [-f] [--regex R] [--since T] [--until T] [--streams S]
    cancel HANDLE | cancel [--backend B] --state S | --partition P | --all [--yes]
    list [--backend B] [--cluster [--user U] [--partition P]] [--state S] [--json]
    cluster [--backend slurm] [--partition P] [--json]
    hold HANDLE / release HANDLE
    runopts BACKEND [--json]
    completion bash|zsh|fish

Global options: ``--session``, ``--state-dir``, ``--log-level`` (the ``supervisor``
logger on stderr), ``--version``. ``NO_COLOR`` turns every escape code off.

Exit codes (``supervisor.cli.codes``); every non-zero one comes with one line on
stderr, ``Error: ...``:

    0    success; ``run``/``status``/``describe``: the app SUCCEEDED or has not ended
    1    the app FAILED (a launch failure too), no such app, the backend failed,
         a backend's extra is not installed, or a cancel by filter was answered no
    2    usage error: unknown option, bad value, malformed handle, invalid app or run options
    3    the app was CANCELLED
    4    the app's state is UNKNOWN (its supervising process vanished)
    130  ``run`` was interrupted (SIGINT, Ctrl-C): the app was cancelled first
    143  ``run`` got SIGTERM: the app was cancelled first
    141  the reader of stdout left (``| head -1``): silent, as for a command SIGPIPE ended

Human output uses rich tables; ``--json`` prints plain JSON on stdout.
The entry point of the ``asupervisor`` script and of ``python -m supervisor``
is ``main`` here: it first checks that the ``supervisor`` package is ours (see
``supervisor.clash``: supervisord installs the same name), then imports the
commands lazily so ``python -m supervisor.cli.main`` runs cleanly too.
"""

from __future__ import annotations

__all__ = ["main"]


def main() -> None:
    from supervisor.clash import check_entry

    check_entry()
    from supervisor.cli.main import main as _main

    _main()
