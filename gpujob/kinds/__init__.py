"""Target kinds: one class per way into a container, registered by name.

A kind connects to its host (``connect``: Targets keeps one link per host), opens
its transport over that link (``open``), names its gpujob home, adds its own plan
steps, gathers and judges its own doctor facts, reports a container's status,
reconnects after a drop, and says whether it may install boot hooks. Adding a
kind (``docker exec`` over ssh, ``kubectl exec``) is one module and one line in
``REGISTRY``, its way in a small gpujob/transport/stacked.py subclass;
tests/local/test_kind_contract.py runs the same contract on each. Kinds know neither
the inventory nor Target: they see a target as ``base.Reached``.
"""

from __future__ import annotations

from gpujob.kinds.base import Kind, Opened
from gpujob.kinds.local import LocalKind
from gpujob.kinds.ssh import SshKind

REGISTRY: dict[str, Kind] = {k.name: k for k in (SshKind(), LocalKind())}
NAMES = tuple(REGISTRY)
#: what ``Kind.status`` says of a container that takes commands
READY = ("running", "local")


def get(name: str) -> Kind:
    try:
        return REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown target kind {name!r}; known: {', '.join(NAMES)}") from None


__all__ = ["Kind", "Opened", "REGISTRY", "NAMES", "READY", "get"]
