"""How to reach an SSH host: its hosts.yaml fields, filled in from ``~/.ssh/config`` as
OpenSSH resolves it (gpujob/transport/ssh_resolve.py: ``ssh -G`` where ssh is installed;
hosts.yaml wins), as the :class:`SshSettings` that ssh.py connects with. A directive that
gpujob cannot honour is named in one line each (``notes``), never silently dropped."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field, fields, replace
from pathlib import Path

from gpujob.errors import InputError
from gpujob.transport import ssh_resolve


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
    identities_only: bool = False   # offer only identity_files (IdentitiesOnly yes)
    allow_agent: bool = True        # IdentityAgent none: False
    notes: list[str] = field(default_factory=list)  # directives gpujob does not honour


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


#: one jump host, [user@]host[:port]; ``ssh -G`` writes the host in brackets: jumper@[10.1.1.1]:2022
_JUMP = re.compile(r"(?:(?P<user>[^@]+)@)?(?:\[(?P<bracketed>[^\]@,]+)\]|(?P<host>[^:@,\[\]]+))"
                   r"(?::(?P<port>\d+))?")


def ssh_settings(host_name: str, host, ssh_config_path: str | Path = "~/.ssh/config") -> SshSettings:
    """How to reach ``host`` (a hosts.yaml host: gpujob.inventory.hosts.Host) over SSH."""
    if getattr(host, "address", None) is None:  # a kind without SSH fields (hosts.yaml refuses them)
        raise InputError(f"host '{host_name}' is {host.kind}; it has no SSH settings")
    path = Path(ssh_config_path).expanduser()
    return _settings(path, SshHost(**{f.name: getattr(host, f.name) for f in fields(SshHost)}),
                     nested=False)


def _settings(config: Path, host: SshHost, nested: bool) -> SshSettings:
    found = ssh_resolve.resolve(host.address, config)
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
        jump_host = replace(host, address=match["host"] or match["bracketed"], user=match["user"], port=port,
                            identity_file=None, proxy_jump=None)
        jump = _settings(config, jump_host, nested=True)
        if not jump.identity_files and host.identity_file:  # no key of its own: try the host's
            jump.identity_files = [os.path.expanduser(host.identity_file)]
    hostname = found.get("hostname") or host.address
    port = host.port or int(found.get("port") or 22)
    user = host.user or (found.get("user") if ssh_resolve.user_was_set(host.address, config, found)
                         else None) or "root"
    configured = found.options.get("identityfile", [])
    if found.by == "ssh -G" and set(configured) <= set(ssh_resolve.DEFAULT_IDENTITIES):
        configured = []  # OpenSSH's defaults: paramiko looks for them itself (look_for_keys)
    identities_only = (found.get("identitiesonly") or "no").lower() in ("yes", "true")

    def expand(value: str) -> str:
        return ssh_resolve.expand_tokens(value, alias=host.address, hostname=hostname, user=user,
                                         port=port)
    if host.identity_file:
        identity = [os.path.expanduser(host.identity_file)]
    elif configured:
        identity = [expand(v) for v in configured]
    elif identities_only:  # only the default files, never the agent's other keys
        identity = [expand(v) for v in ssh_resolve.DEFAULT_IDENTITIES]
    else:
        identity = []
    agent = (found.get("identityagent") or "").lower() != "none"
    known = host.known_hosts or _known_hosts(found)
    return SshSettings(
        hostname=hostname,
        port=port,
        user=user,
        identity_files=identity,
        known_hosts=Path(known or "~/.ssh/known_hosts").expanduser(),
        proxy_jump=proxy_jump,
        connect_timeout=host.connect_timeout,
        keepalive=host.keepalive,
        jump=jump,
        identities_only=identities_only,
        allow_agent=agent,
        notes=_notes(host.address, config, found, identity),
    )


def _known_hosts(found) -> str | None:
    """The config's UserKnownHostsFile when it is not OpenSSH's default (``ssh -G`` prints
    the default expanded with the account's home, which the tests' fresh $HOME is not)."""
    files = found.options.get("userknownhostsfile", [""])[0].split()
    if not files or files[0].lower() == "none":
        return None
    default = os.path.join(ssh_resolve.account_home(), ".ssh", "known_hosts")
    return None if files[0] == default else files[0]


def _notes(alias: str, config: Path, found, identity: list[str]) -> list[str]:
    """One line for each directive of the config that gpujob does not honour."""
    where = f"{config}: host '{alias}'"
    notes = []
    if (found.get("proxycommand") or "none").lower() != "none":
        notes.append(f"{where}: ProxyCommand is not honoured: gpujob connects directly, or through "
                     "proxy_jump / ProxyJump")
    for cert in found.options.get("certificatefile", []):
        if not any(os.path.expanduser(cert) == f"{k}-cert.pub" for k in identity):
            notes.append(f"{where}: CertificateFile {cert} is not honoured: gpujob offers only "
                         "KEY-cert.pub beside an identity file KEY")
    if found.get("hostkeyalias"):
        notes.append(f"{where}: HostKeyAlias is not honoured: the host key is looked up under "
                     "the host name and port")
    strict = (found.get("stricthostkeychecking") or "ask").lower()
    strict = "no" if strict in ("false", "off") else strict  # ssh -G writes `no` as false
    if strict in ("no", "accept-new"):
        notes.append(f"{where}: StrictHostKeyChecking {strict} is not honoured: gpujob refuses "
                     "unknown host keys (add one with --accept-new)")
    agent = found.get("identityagent")
    if agent and agent.lower() not in ("none", "ssh_auth_sock", "$ssh_auth_sock"):
        notes.append(f"{where}: IdentityAgent {agent} is not honoured: gpujob asks the agent "
                     "of $SSH_AUTH_SOCK")
    extra = found.options.get("userknownhostsfile", [""])[0].split()[1:]
    default2 = os.path.join(ssh_resolve.account_home(), ".ssh", "known_hosts2")
    if [f for f in extra if f != default2]:
        notes.append(f"{where}: UserKnownHostsFile names several files: gpujob reads only the first")
    if (found.get("pkcs11provider") or "none").lower() != "none":
        notes.append(f"{where}: PKCS11Provider is not honoured")
    return notes
