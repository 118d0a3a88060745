"""What the user's ssh config says about one host, as OpenSSH itself resolves it.

Where ``ssh`` is on PATH, ``ssh -G HOST`` decides (argv, no shell): OpenSSH's own reading
of ``Include``, ``Host``/``Match``, canonicalisation, tokens and defaults. The user's
default config (``~/.ssh/config`` when $HOME is the account's home) is read as ``ssh HOST``
reads it, with the system-wide ``/etc/ssh/ssh_config``; any other file with ``-F`` (then
only that file, as ``ssh -F`` does). Without ``ssh``: paramiko's parser with ``Include``
followed (gpujob/transport/ssh_include.py).

Each answer is kept for the life of the process, until one of the files it was read from
changes: ``ssh -G`` runs at most once per host per process."""

from __future__ import annotations

import getpass
import os
import pwd
import shlex
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from gpujob.errors import InputError
from gpujob.transport import ssh_include

#: OpenSSH's IdentityFile list when none is configured (ssh -G prints it as is)
DEFAULT_IDENTITIES = tuple(f"~/.ssh/id_{k}" for k in
                           ("rsa", "ecdsa", "ecdsa_sk", "ed25519", "ed25519_sk", "xmss", "dsa"))


@dataclass
class Resolved:
    """One host's options: lower-case keys, each a list of values (in the file's order)."""
    options: dict[str, list[str]]
    files: list[str]          # the config files (and glob folders) the answer depends on
    by: str                   # "ssh -G" or "paramiko"
    stamp: list = field(default_factory=list)
    user_set: bool | None = None  # whether the files name a User (user_was_set), once known

    def get(self, key: str) -> str | None:
        values = self.options.get(key)
        return values[0] if values else None


_cache: dict[tuple[str, str, str], Resolved] = {}


def _stat(path: str):
    try:
        st = os.stat(path)
        return (st.st_ino, st.st_size, st.st_mtime_ns)
    except OSError:
        return None


def account_home() -> str:
    try:
        return pwd.getpwuid(os.getuid()).pw_dir
    except KeyError:
        return os.path.expanduser("~")


def resolve(alias: str, config: Path) -> Resolved:
    """``alias``'s options from ``config`` (the user's ``~/.ssh/config``, expanded)."""
    ssh = shutil.which("ssh")
    key = (alias, str(config), ssh or "")
    hit = _cache.get(key)
    if hit is not None and [_stat(f) for f in hit.files] == hit.stamp:
        return hit
    files = ssh_include.config_files(config)
    stamp = [_stat(f) for f in files]  # before reading: a change meanwhile is seen next time
    found = _by_ssh(ssh, alias, config) if ssh else _by_paramiko(alias, config)
    found.files, found.stamp = files, stamp
    _cache[key] = found
    return found


def _by_ssh(ssh: str, alias: str, config: Path) -> Resolved:
    argv = [ssh, "-G"]
    if config != Path(account_home()) / ".ssh" / "config":
        argv += ["-F", str(config) if config.is_file() else os.devnull]
    argv += ["--", alias]
    try:
        p = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, timeout=30)
    except subprocess.TimeoutExpired:
        raise InputError(f"`ssh -G {alias}` (reading {config}) gave no answer within 30 s "
                         "(a Match exec or a canonicalisation lookup that hangs?)") from None
    if p.returncode != 0:
        said = [line for line in p.stderr.decode("utf-8", "replace").splitlines()
                if line.strip() and "Pseudo-terminal" not in line]
        raise InputError(f"ssh config for host '{alias}': {said[0] if said else 'ssh -G failed'}"[:400],
                         hint=f"`{shlex.join(['ssh', *argv[1:]])}` says the same; fix {config}")
    options: dict[str, list[str]] = {}
    for line in p.stdout.decode("utf-8", "replace").splitlines():
        k, _, v = line.partition(" ")
        if k:
            options.setdefault(k.lower(), []).append(v)
    return Resolved(options, [], "ssh -G")


def _by_paramiko(alias: str, config: Path) -> Resolved:
    if not config.is_file():
        return Resolved({"hostname": [alias]}, [], "paramiko")
    parsed, _ = ssh_include.read(config)
    try:
        found = parsed.lookup(alias)
    except Exception as e:  # Match exec without invoke, a canonicalisation failure, ...
        raise InputError(f"{config}: host '{alias}': {e}") from None
    options = {k.lower(): (list(v) if isinstance(v, list) else [v]) for k, v in found.items()
               if v is not None}
    return Resolved(options, [], "paramiko")


def user_was_set(alias: str, config: Path, resolved: Resolved) -> bool:
    """Whether the config names a User for ``alias``: ``ssh -G`` prints the local user
    when none is set, so a User equal to the local one is looked up in the files."""
    user = resolved.get("user")
    if user is None:
        return False
    if resolved.by == "paramiko" or user != getpass.getuser():
        return True
    if resolved.user_set is None:  # read the files once per answer
        try:
            resolved.user_set = bool(_by_paramiko(alias, config).get("user"))
        except InputError:
            resolved.user_set = False
    return resolved.user_set


def expand_tokens(value: str, *, alias: str, hostname: str, user: str, port: int) -> str:
    """OpenSSH's tokens in IdentityFile and CertificateFile (``ssh -G`` prints them as written)."""
    if value.startswith("~"):
        value = os.path.expanduser(value)
    if "%" not in value:
        return value
    import socket
    table = {"%": "%", "d": os.path.expanduser("~"), "u": getpass.getuser(), "h": hostname,
             "r": user, "p": str(port), "n": alias, "i": str(os.getuid()),
             "l": socket.gethostname(), "L": socket.gethostname().split(".")[0]}
    out, i = [], 0
    while i < len(value):
        if value[i] == "%" and i + 1 < len(value) and value[i + 1] in table:
            out.append(table[value[i + 1]])
            i += 2
        else:
            out.append(value[i])
            i += 1
    return "".join(out)
