"""``logging`` records of what the Supervisor decides, on the ``supervisor`` logger.

Every record carries structured ``extra`` fields (``handle``, ``role``, ``replica``,
``source``, ``dest``, ``attempt``, ``reason``) so a JSON formatter or a log shipper
can index them without parsing the message; a field that does not apply is None
(a restart or a gang stop has no ``source``/``dest``), so a format string naming
any of them works for every record. Levels: an app's transitions are INFO
(WARNING when it ends FAILED or UNKNOWN), a replica's are DEBUG (INFO when it
fails), restarts and gang stops INFO, a broken supervision ERROR with its traceback.
A disabled level costs one ``isEnabledFor`` per transition.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from supervisor.status import Transition

__all__ = ["LOGGER_NAME", "log_action", "log_internal_error", "log_transitions"]

LOGGER_NAME = "supervisor"
_log = logging.getLogger(LOGGER_NAME)
# A library's records go where the application sends them, and nowhere when it configured
# nothing: without this, Python's last-resort handler prints WARNINGs (a FAILED app) to
# stderr of every program that embeds us, the CLI's one-line errors included.
_log.addHandler(logging.NullHandler())

_BAD_ENDS = frozenset({"FAILED", "UNKNOWN"})


def _fields(
    handle: str,
    role: str | None,
    replica: int | None,
    reason: str,
    *,
    source: str | None = None,
    dest: str | None = None,
    attempt: int | None = None,
) -> dict[str, object]:
    """The structured fields, every one of them on every record."""
    return {
        "handle": handle,
        "role": role,
        "replica": replica,
        "source": source,
        "dest": dest,
        "attempt": attempt,
        "reason": reason,
    }


def _level(t: Transition) -> int:
    if t.role is None:
        return logging.WARNING if t.dest in _BAD_ENDS else logging.INFO
    return logging.INFO if t.dest in _BAD_ENDS else logging.DEBUG


def log_transitions(handle: str, transitions: Iterable[Transition]) -> None:
    for t in transitions:
        level = _level(t)
        if not _log.isEnabledFor(level):
            continue
        _log.log(
            level,
            "%s %s: %s -> %s%s",
            handle,
            t.scope,
            t.source,
            t.dest,
            f" ({t.msg})" if t.msg else "",
            extra=_fields(
                handle,
                t.role,
                t.replica_id,
                t.msg,
                source=t.source,
                dest=t.dest,
                attempt=t.attempt,
            ),
        )


def log_action(handle: str, verb: str, keys: Iterable[tuple[str, int]], reason: str) -> None:
    """A decision of the FSM about several replicas: ``restart`` (a retry) or ``stop``."""
    if not _log.isEnabledFor(logging.INFO):
        return
    keys = list(keys)
    for role, replica in keys:
        _log.info(
            "%s %s/%d: %s (%s)",
            handle,
            role,
            replica,
            verb,
            reason,
            extra=_fields(handle, role, replica, reason),
        )


def log_internal_error(handle: str, doing: str, error: BaseException) -> None:
    """Supervision of an app broke: the traceback goes with the record, never lost."""
    _log.error(
        "%s: %s failed: %s",
        handle,
        doing,
        error,
        exc_info=(type(error), error, error.__traceback__),
        extra=_fields(handle, None, None, str(error)),
    )
