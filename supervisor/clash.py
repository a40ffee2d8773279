"""Detecting supervisord's ``supervisor`` package where ours should be.

supervisord (PyPI ``supervisor``) installs the same import package name,
``supervisor``, so one environment cannot hold both: the second install
overwrites the first one's ``__init__.py`` (and ``events.py``), and
uninstalling supervisord deletes ours. What is detectable depends on who owns
``__init__.py``:

- supervisord's (it was installed after us): ``import supervisor`` never runs
  our code, so only our own entry points can explain, which ``asupervisor`` and
  ``python -m supervisor`` do through ``check_entry``;
- none (supervisord was uninstalled after a mixed install): the same;
- ours, with supervisord's modules beside it: our ``__init__`` warns through
  ``warn_if_mixed``, since everything works until either is uninstalled.

Standard library only, and nothing from ``supervisor`` itself: it must run when
the package around it is broken.
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path
from types import ModuleType

__all__ = ["FIX", "check_entry", "diagnose", "warn_if_mixed"]

PACKAGE_DIR = Path(__file__).resolve().parent
# Modules only supervisord ships (its events.py shares our name, so it is no sign).
_SUPERVISORD_MODULES = ("supervisord.py", "supervisorctl.py", "xmlrpc.py", "rpcinterface.py")
FIX = (
    "fix: keep them in separate environments: "
    "pip uninstall -y supervisor asupervisor && pip install asupervisor "
    "(with the extras you use), and install supervisord on its own (e.g. pipx install supervisor)"
)


_MIXED = (
    f"supervisord (PyPI 'supervisor') is installed into asupervisor's package directory "
    f"{PACKAGE_DIR}: both use the import package 'supervisor', so uninstalling either "
    f"breaks the other; {FIX}"
)


def _has_supervisord_files(where: Path) -> bool:
    return any((where / name).exists() for name in _SUPERVISORD_MODULES)


def diagnose(package: ModuleType | None) -> str | None:
    """Why the imported ``supervisor`` package is not (all) asupervisor's, or None if it is."""
    init = PACKAGE_DIR / "__init__.py"
    if not init.exists():
        return (
            f"asupervisor is broken: {init} is missing. supervisord (PyPI 'supervisor') "
            "installs the same import package 'supervisor', and uninstalling it deleted "
            f"asupervisor's __init__.py; {FIX}"
        )
    if package is None or not hasattr(package, "Supervisor"):
        where = getattr(package, "__file__", None) or str(init)
        return (
            f"the 'supervisor' package at {where} is supervisord's (PyPI 'supervisor'), "
            f"not asupervisor's: both install the import package 'supervisor'; {FIX}"
        )
    if _has_supervisord_files(PACKAGE_DIR):
        return _MIXED
    return None


def check_entry() -> None:
    """For the console script and ``python -m supervisor``: exit 1 with the explanation
    when the ``supervisor`` package is not asupervisor's (a shared one that works was
    warned about on import)."""
    package = sys.modules.get("supervisor")
    problem = diagnose(package)
    if problem is None or problem is _MIXED:
        return  # mixed but working: ``warn_if_mixed`` said so when ``supervisor`` was imported
    # A stderr closed at start (``2>&-``) is None, and ``print(file=None)`` writes to
    # stdout, into what a script reads (``h=$(asupervisor run ...)``): the message goes
    # nowhere then, as the CLI's ``render.std_stream`` has it (not imported: this runs
    # when the package around it is broken).
    if sys.stderr is not None:
        print(f"asupervisor: {problem}", file=sys.stderr)
    raise SystemExit(1)


def warn_if_mixed() -> None:
    """Called by our ``__init__``: supervisord's files beside ours work until an uninstall."""
    if _has_supervisord_files(PACKAGE_DIR):
        warnings.warn(_MIXED, RuntimeWarning, stacklevel=3)
