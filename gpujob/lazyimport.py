"""Modules that load when first used, not when imported (stdlib only).

paramiko imports ``invoke`` at its top (~100-230 ms here: invoke's collection, parser,
runners, …) only to run the ``Match exec`` lines of an ssh config, which almost no
config has; every command that reaches an SSH host paid for it. :func:`defer` puts a
stand-in module in ``sys.modules`` (the import machinery reads only its ``__spec__``),
so ``import invoke`` costs nothing, and the first use of one of its names imports it
for real: a ``Match exec`` still works.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import types


class _Deferred(types.ModuleType):
    """A stand-in in ``sys.modules``: the first attribute asked of it that it lacks
    imports the real module (which then replaces it there) and is answered from it."""

    def __getattr__(self, attr):
        name = self.__name__
        real = sys.modules.get(name)
        if real is None or real is self:
            sys.modules.pop(name, None)
            real = importlib.import_module(name)
        return getattr(real, attr)


def defer(name: str) -> None:
    """Make the next ``import name`` lazy (nothing when it is loaded or not installed)."""
    if name in sys.modules:
        return
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return
    if spec is None:
        return
    stand_in = _Deferred(name)
    stand_in.__spec__ = spec
    sys.modules[name] = stand_in


def paramiko():
    """paramiko, with its ``invoke`` deferred."""
    defer("invoke")
    import paramiko as mod
    return mod
