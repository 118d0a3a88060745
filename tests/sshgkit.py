"""What the ssh-config tests share (tests/test_ssh_config_*.py): a fresh home that OpenSSH
itself reads, and what ``ssh -G`` answers there.

OpenSSH takes ``~`` (``~/.ssh/config``, a relative ``Include``, ``IdentityFile ~/…``) from
the account's home (getpwuid), never from $HOME. So a test gives ``ssh`` and gpujob the same
fresh home by running both in a mount namespace of their own in which the account's home is
an overlay: the test's home folder its upper layer, its ``.ssh`` opaque (the machine's own
~/.ssh is not seen), HOME set to it; the rest of the real home (a pyenv python, say) shows
through read-only below, nothing is written to it, and the overlay ends with the
namespace's last process."""

from __future__ import annotations

import json
import os
import pwd
import subprocess
import sys
import tempfile
from pathlib import Path

ACCOUNT_HOME = pwd.getpwuid(os.getuid()).pw_dir

#: gpujob's settings of each alias in argv, as JSON (run inside in_home)
SETTINGS = r"""
import json, sys
from gpujob.errors import GpujobError
from gpujob.inventory.hosts import Container, Host
from gpujob.transport.ssh_config import ssh_settings
out = {}
for alias in sys.argv[1:]:
    try:
        s = ssh_settings("h", Host(address=alias, containers={"c": Container(vmid=200)}))
    except GpujobError as e:
        out[alias] = {"error": e.message}
        continue
    out[alias] = {"hostname": s.hostname, "port": s.port, "user": s.user,
                  "identity_files": s.identity_files, "proxy_jump": s.proxy_jump,
                  "identities_only": getattr(s, "identities_only", None),
                  "known_hosts": str(s.known_hosts), "notes": getattr(s, "notes", None),
                  "jump": [s.jump.user, s.jump.hostname, s.jump.port] if s.jump else None}
print(json.dumps(out))
"""


def in_home(home: Path, argv: list[str], env: dict | None = None, *, timeout: float = 180,
            path: str | None = None) -> subprocess.CompletedProcess:
    """``argv`` with ``home`` as the account's home (see above); ``path``: its PATH."""
    e = dict(env if env is not None else os.environ, HOME=ACCOUNT_HOME)
    inner = ["env", f"PATH={path}", *argv] if path is not None else argv
    work = tempfile.mkdtemp(prefix="ovwork-", dir=home.parent)  # one per mount, beside the layer
    opts = f"lowerdir={ACCOUNT_HOME},upperdir={home},workdir={work}"
    return subprocess.run(["unshare", "-m", "sh", "-c",
                           'mount -t overlay overlay -o "$0" "$1" && shift && exec "$@"',
                           opts, ACCOUNT_HOME, *inner],
                          env=e, capture_output=True, timeout=timeout, stdin=subprocess.DEVNULL)


def ssh_g(home: Path, alias: str) -> dict[str, list[str]]:
    """What ``ssh -G ALIAS`` answers in ``home``: each key's values."""
    p = in_home(home, ["ssh", "-G", alias])
    assert p.returncode == 0, p.stderr
    found: dict[str, list[str]] = {}
    for line in p.stdout.decode().splitlines():
        k, _, v = line.partition(" ")
        found.setdefault(k, []).append(v)
    return found


def settings(home: Path, *aliases: str, path: str | None = None) -> dict:
    """gpujob's settings of each alias in ``home`` (``path``: a PATH, one without ssh say)."""
    p = in_home(home, [sys.executable, "-c", SETTINGS, *aliases], path=path)
    assert p.returncode == 0, p.stderr.decode()
    return json.loads(p.stdout)


def expected(home: Path, alias: str) -> dict:
    """What OpenSSH resolves for ``alias``, in gpujob's words (``~`` as the account's home)."""
    g = ssh_g(home, alias)
    ids = g.get("identityfile", [])
    defaults = {f"~/.ssh/id_{k}" for k in ("rsa", "ecdsa", "ecdsa_sk", "ed25519", "ed25519_sk", "xmss",
                                           "dsa")}
    # ssh -G prints IdentityFile as written: OpenSSH expands ~, %d and %h when it loads the file
    ids = [] if set(ids) <= defaults else [
        i.replace("~", ACCOUNT_HOME, 1).replace("%d", ACCOUNT_HOME).replace("%h", g["hostname"][0])
        for i in ids]
    return {"hostname": g["hostname"][0], "port": int(g["port"][0]), "user": g["user"][0],
            "identity_files": ids, "proxy_jump": g.get("proxyjump", [None])[0],
            "identities_only": g["identitiesonly"][0] == "yes"}


def write(home: Path, files: dict[str, str]) -> None:
    """Files under ``home``/.ssh (0600, as OpenSSH wants them), the folder opaque."""
    ssh = home / ".ssh"
    ssh.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.setxattr(ssh, "trusted.overlay.opaque", b"y")  # the account's own ~/.ssh stays unseen
    for name, text in files.items():
        f = ssh / name
        f.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        f.write_text(text)
        f.chmod(0o600)
