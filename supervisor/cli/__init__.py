"""The ``asupervisor`` command line.

Commands (``asupervisor COMMAND --help`` for each)::

    run [--backend B] [--cfg k=v,...] [--dryrun] [--wait] [--log] [--json] TARGET [ARGS...]
    status HANDLE [--json]
    describe HANDLE [--json]
    log HANDLE [ROLE[/K]] [-f] [--regex R] [--since T] [--until T] [--streams S]
    cancel HANDLE
    list [--backend B] [--json]
    runopts BACKEND [--json]

Exit codes (``supervisor.cli.codes``):

    0    success; for ``run``: the app SUCCEEDED
    1    the app FAILED, the handle names no app, or the backend failed
    2    usage error: unknown option, bad value, malformed handle, invalid app or run options
    3    the app was CANCELLED
    4    the app's state is UNKNOWN (its supervising process vanished)
    130  ``run`` was interrupted (SIGINT, Ctrl-C): the app was cancelled first
    143  ``run`` got SIGTERM: the app was cancelled first

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
