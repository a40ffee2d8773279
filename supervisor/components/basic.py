"""The simplest components: ``echo`` and ``sh``."""

from __future__ import annotations

import shlex

from supervisor.specs import AppDef, Role

__all__ = ["echo", "sh", "torchx_sh"]


def echo(msg: str = "hello world", num_replicas: int = 1, image: str = "") -> AppDef:
    """Print a message from each replica; a quick check that a backend works.

    Macros such as ``${replica_id}`` in the message are substituted; ``$$``
    gives a literal dollar sign.

    Args:
        msg: the message to print
        num_replicas: how many replicas print it
        image: the container image to run it in (docker needs one; none for local)
    """
    role = Role(name="echo", entrypoint="echo", args=[msg], num_replicas=num_replicas, image=image)
    return AppDef(name="echo", roles=[role])


def sh(*args: str, num_replicas: int = 1, name: str = "sh", image: str = "") -> AppDef:
    """Run a shell snippet (``sh -c "ARGS..."``) on each replica.

    The arguments are joined with spaces into one script, so
    ``sh echo hi '&&' exit 3`` runs ``echo hi && exit 3``. Macros are
    substituted first (``${replica_id}``, ``${app_id}``); write ``$$`` for a
    dollar sign the shell should see, e.g. ``$$HOME``, although an unknown
    ``$HOME`` is left as it is anyway.

    Args:
        args: the words of the script
        num_replicas: how many replicas run it
        name: the app's and the role's name
        image: the container image to run it in (docker needs one; none for local)
    """
    script = " ".join(args)
    role = Role(
        name=name, entrypoint="sh", args=["-c", script], num_replicas=num_replicas, image=image
    )
    return AppDef(name=name, roles=[role])


def torchx_sh(*args: str, num_replicas: int = 1, name: str = "sh", image: str = "") -> AppDef:
    """Run a command through ``sh -c``, each argument one word of it, as TorchX's ``utils.sh``.

    TorchX quotes every argument (``shlex.quote``) before it joins them, so
    ``utils.sh python3 -c 'print("hi")'`` runs as typed; ``sh`` joins them as
    they are, a script (``sh echo hi '&&' exit 3``). Ported command lines keep
    TorchX's meaning under TorchX's name.

    Args:
        args: the command and its arguments
        num_replicas: how many replicas run it
        name: the app's and the role's name
        image: the container image to run it in (docker needs one; none for local)
    """
    return sh(shlex.join(args), num_replicas=num_replicas, name=name, image=image)
