"""Parameter values without pydantic where nothing is to convert.

typer (>= 0.2x) coerces every parameter value through a pydantic ``TypeAdapter``,
built on first use; importing pydantic and building that adapter costs ~100 ms of
every command's start (the root's ``--hosts`` is coerced on every command, even for
``gpujob status --help``). Most values need no conversion: an option left unset
(``None``), or text for a ``str`` parameter. :func:`install` gives each parameter a
coercion that answers those two cases as typer's own would (``None`` → ``None``, or
``()`` for a multi-value one; a ``str`` for ``str``/``Optional[str]``; a sequence of
``str`` for ``list[str]``, as a list) and hands every other value to typer's adapter,
built then. A typer without these internals is left as it is.
"""

from __future__ import annotations

import typing

_STR = (str, typing.Optional[str])
_STRS = (typing.List[str], list[str], typing.Optional[typing.List[str]], typing.Optional[list[str]])


class _Lazy:
    """typer's RuntimeParam contract (``coerce(value, param, ctx)``), the adapter deferred."""

    def __init__(self, param, build):
        self._param, self._build, self._real = param, build, None
        ann = param.type_descriptor.annotation
        self._kind = "str" if ann in _STR else "strs" if ann in _STRS else None

    def coerce(self, value, param, ctx):
        multi = param.multiple or param.nargs == -1
        if value is None:
            return () if multi else None
        if self._kind == "str" and not multi and type(value) is str:
            return value
        if self._kind == "strs" and multi and isinstance(value, (list, tuple)) and \
                all(type(v) is str for v in value):
            return list(value)
        if self._real is None:
            self._real = self._build(self._param.type_descriptor)
        return self._real.coerce(value, param=param, ctx=ctx)

    def __getattr__(self, name):  # anything else typer asks of its RuntimeParam
        if self._real is None:
            self._real = self._build(self._param.type_descriptor)
        return getattr(self._real, name)


def install(param) -> None:
    """Defer ``param``'s pydantic adapter (a no-op on a typer without them)."""
    if getattr(param, "_runtime_param", False) is not None or not hasattr(param, "type_descriptor"):
        return
    try:
        from typer._coercion import build_runtime_param
    except ImportError:  # pragma: no cover - another typer
        return
    param._runtime_param = _Lazy(param, build_runtime_param)
