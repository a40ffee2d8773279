"""The supervision case's app for ``torchx run bench/components/torchx_app.py:sleepers``.

No ``from __future__ import annotations``: TorchX reads the annotations as types.
"""

import torchx.specs as specs


def sleepers(n: int = 100, seconds: str = "10") -> specs.AppDef:
    """N replicas of ``sleep SECONDS``.

    Args:
        n: how many replicas
        seconds: how long each sleeps
    """
    return specs.AppDef(
        name="sleepers",
        roles=[
            specs.Role(name="sleep", image="/", entrypoint="sleep", args=[seconds], num_replicas=n)
        ],
    )
