"""How to reach an SSH host: its hosts.yaml fields, filled in from ``~/.ssh/config``
(hosts.yaml wins), as the :class:`SshSettings` that ssh.py connects with."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING

from gpujob.errors import InputError

if TYPE_CHECKING:
    import paramiko


@dataclass
class SshSettings:
    hostname: str
    port: int
    user: str
    identity_files: list[str]
    known_hosts: Path
    proxy_jump: str | None
    connect_timeout: float
    keepalive: float
    jump: SshSettings | None = None


@dataclass(frozen=True)
class SshHost:
    """The hosts.yaml fields of a host that say how to reach it over SSH."""
    address: str
    port: int | None = None
    user: str | None = None
    identity_file: str | None = None
    known_hosts: str | None = None
    proxy_jump: str | None = None
    connect_timeout: float = 10.0
    keepalive: float = 15.0


_JUMP = re.compile(r"(?:(?P<user>[^@]+)@)?(?P<host>[^:@,]+)(?::(?P<port>\d+))?")


def ssh_settings(host_name: str, host, ssh_config_path: str | Path = "~/.ssh/config") -> SshSettings:
    """How to reach ``host`` (a hosts.yaml host: gpujob.inventory.hosts.Host) over SSH."""
    if getattr(host, "address", None) is None:  # a kind without SSH fields (hosts.yaml refuses them)
        raise InputError(f"host '{host_name}' is {host.kind}; it has no SSH settings")
    path = Path(ssh_config_path).expanduser()
    from gpujob.lazyimport import paramiko as _paramiko
    paramiko = _paramiko()  # only ssh hosts need it: the local demo starts faster without

    config = paramiko.SSHConfig.from_path(str(path)) if path.is_file() else paramiko.SSHConfig()
    return _settings(config, SshHost(**{f.name: getattr(host, f.name) for f in fields(SshHost)}),
                     nested=False)


def _settings(config: "paramiko.SSHConfig", host: SshHost, nested: bool) -> SshSettings:
    found = config.lookup(host.address)
    proxy_jump = host.proxy_jump or found.get("proxyjump")
    if proxy_jump and proxy_jump.lower() == "none":
        proxy_jump = None
    jump = None
    if proxy_jump:
        match = _JUMP.fullmatch(proxy_jump)
        if not match:
            raise InputError(f"proxy_jump '{proxy_jump}': expected one jump host, [user@]host[:port]")
        if nested:
            raise InputError(f"proxy_jump '{proxy_jump}' of jump host '{host.address}': "
                             "only one level of jump is supported")
        port = int(match["port"]) if match["port"] else None
        jump_host = replace(host, address=match["host"], user=match["user"], port=port,
                            identity_file=None, proxy_jump=None)
        jump = _settings(config, jump_host, nested=True)
        if not jump.identity_files and host.identity_file:  # no key of its own: try the host's
            jump.identity_files = [os.path.expanduser(host.identity_file)]
    identity = [host.identity_file] if host.identity_file else found.get("identityfile", [])
    return SshSettings(
        hostname=found["hostname"],
        port=host.port or int(found.get("port", 22)),
        user=host.user or found.get("user", "root"),
        identity_files=[os.path.expanduser(path) for path in identity],
        known_hosts=Path(host.known_hosts or "~/.ssh/known_hosts").expanduser(),
        proxy_jump=proxy_jump,
        connect_timeout=host.connect_timeout,
        keepalive=host.keepalive,
        jump=jump,
    )
