"""``kind: local``: a directory of this machine stands in for a container."""

from __future__ import annotations

import sys
from pathlib import Path

from gpujob.kinds.base import Kind, Opened
from gpujob.transport.local import LocalTransport


class LocalKind(Kind):
    name = "local"
    container_fields = ("root",)
    container_required = ("root",)
    boot_hooks = False  # its rc.local would be this machine's
    ships_uv = False    # our uv runs here as it is
    default_address = "127.0.0.1"  # every local "container" is this machine

    def open(self, host, entry, cname, container) -> Opened:
        root = str(Path(container.root).expanduser().resolve())
        return Opened(LocalTransport(), None, root, sys.executable)

    def status(self, target) -> str:
        return "local"

    def reconnect(self, target) -> None:
        pass  # nothing between us and a local target can drop
