"""Short, safe renderings of arbitrary values for error messages.

Validation reports whatever a caller passed, and a caller may pass anything:
a huge list, or an object whose ``__repr__`` raises. Messages must stay short
and building them must never fail.
"""

from __future__ import annotations

import reprlib

__all__ = ["brief"]


class _BriefRepr(reprlib.Repr):
    """``reprlib`` limits, but a failing ``__repr__`` gives ``<TypeName>`` (no address)."""

    def repr_instance(self, x: object, level: int) -> str:
        try:
            text = repr(x)
        except Exception:
            return f"<{type(x).__name__}>"
        if len(text) > self.maxother:
            half = (self.maxother - 3) // 2
            return f"{text[:half]}...{text[len(text) - half :]}"
        return text


_short = _BriefRepr()
_short.maxstring = 40
_short.maxother = 40
_short.maxlist = 4
_short.maxtuple = 4
_short.maxdict = 4
_short.maxlevel = 2


def brief(value: object) -> str:
    """A short repr for messages; never raises, whatever ``value`` does in ``__repr__``."""
    try:
        return _short.repr(value)
    except Exception:
        return f"<{type(value).__name__}>"
