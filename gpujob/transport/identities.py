"""``IdentitiesOnly yes`` as OpenSSH does it: only the configured identity files are
offered; the ssh-agent is asked to sign only for a key whose public part is one of
theirs (a passphrase-protected key loaded in the agent), never for its other keys."""

from __future__ import annotations

import base64
from pathlib import Path


def public_blob(key_file: str) -> bytes | None:
    """The public key of an identity file: its ``.pub`` beside it (as OpenSSH reads it), else
    the private file when it opens without a passphrase; None when neither can be read."""
    pub = Path(key_file + ".pub")
    try:
        words = pub.read_text(encoding="utf-8").split()
        if len(words) >= 2:
            return base64.b64decode(words[1], validate=True)
    except (OSError, UnicodeDecodeError, ValueError):
        pass
    from gpujob.lazyimport import paramiko as _paramiko
    paramiko = _paramiko()
    try:
        return paramiko.PKey.from_path(key_file).asbytes()
    except Exception:  # encrypted, unknown type, unreadable: the agent cannot be matched to it
        return None


class AgentKeys:
    """The agent's keys that match configured identity files (closed after the login)."""

    def __init__(self, key_files: list[str]):
        self.agent = None
        self.keys: list = []
        blobs = [b for b in (public_blob(k) for k in key_files) if b is not None]
        if not blobs:
            return
        from gpujob.lazyimport import paramiko as _paramiko
        paramiko = _paramiko()
        try:
            self.agent = paramiko.Agent()
            held = {k.asbytes(): k for k in self.agent.get_keys()}
        except Exception:  # no agent, or one that does not answer: the files alone are offered
            self.close()
            return
        self.keys = [held[b] for b in blobs if b in held]

    def close(self) -> None:
        if self.agent is not None:
            self.agent.close()
            self.agent = None
