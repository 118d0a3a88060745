"""An inventory's names (stdlib only, pure): its targets, and a target's name resolved
to its host and container, over the validated hosts mapping. Shared by the model
(gpujob/inventory/hosts.py) and the cached view of it (gpujob/inventory/cache.py), so both resolve
alike and neither imports the other for it."""

from __future__ import annotations

from typing import Callable

from gpujob.errors import InputError


def targets(hosts: dict) -> list[tuple[str, str]]:
    return [(h, c) for h, host in hosts.items() for c in host.containers]


def resolve(hosts: dict, source: str, target: str, embedded_note: Callable[[], str]):
    """`name` or `host/name` -> (host name, host, container name, container), or InputError
    (``embedded_note()`` added when the inventory is the built-in one)."""
    found_all = targets(hosts)
    host_name, _, name = target.rpartition("/")
    found = [(h, c) for h, c in found_all if c == name and (not host_name or h == host_name)]
    if len(found) > 1:
        choices = " or ".join(f"{h}/{c}" for h, c in found)
        raise InputError(f"target '{target}' is on several hosts; say {choices}")
    if not found:
        from gpujob.yamlsrc import suggest
        names = [c for _, c in found_all]
        known = [c if names.count(c) == 1 else f"{h}/{c}" for h, c in found_all]
        note = f" ({embedded_note()})" if source == "embedded default" else ""
        raise InputError(f"unknown target '{target}'; known: {', '.join(known)}"
                         + suggest(target, known + [f"{h}/{c}" for h, c in found_all]) + note)
    h, c = found[0]
    return h, hosts[h], c, hosts[h].containers[c]
