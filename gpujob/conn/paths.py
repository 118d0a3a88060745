"""Where the connection daemon lives, and what a request must agree on with it
(stdlib only: the thin client imports this)."""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

#: seconds a daemon with nothing to do stays up (GPUJOB_CONN_IDLE overrides)
DEFAULT_IDLE = 300.0
#: variables that change what a command does on the controller side: a daemon
#: started under other values would act for another user, state dir or ssh-agent
ENV_KEYS = ("HOME", "USER", "XDG_STATE_HOME", "XDG_CONFIG_HOME", "SSH_AUTH_SOCK")
#: what rich reads from the environment to decide width, colours and terminal-ness
TERM_KEYS = ("COLUMNS", "LINES", "NO_COLOR", "FORCE_COLOR", "TERM", "COLORTERM", "TTY_COMPATIBLE",
             "TTY_INTERACTIVE", "JUPYTER_COLUMNS", "JUPYTER_LINES")


class NoDaemon(Exception):
    """The kept connection cannot be used here; run the command directly."""


def disabled() -> bool:
    return os.environ.get("GPUJOB_NO_DAEMON", "") not in ("", "0")


def idle_seconds() -> float:
    try:
        return max(1.0, float(os.environ.get("GPUJOB_CONN_IDLE", DEFAULT_IDLE)))
    except ValueError:
        return DEFAULT_IDLE


def _private_dir(path: Path, create: bool) -> Path:
    """``path`` when it is a real directory of ours that nobody else may enter."""
    if create:
        try:
            path.mkdir(mode=0o700)
        except FileExistsError:
            pass
        except OSError as e:
            raise NoDaemon(f"cannot create {path}: {e.strerror}") from None
    try:
        st = os.lstat(path)
    except OSError as e:
        raise NoDaemon(f"{path}: {e.strerror}") from None
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
        raise NoDaemon(f"{path} is not a private directory of uid {os.getuid()}")
    return path


def runtime_dir(create: bool = True) -> Path:
    """$XDG_RUNTIME_DIR/gpujob when that runtime dir is ours, else /tmp/gpujob-UID (0700, checked)."""
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    if xdg:
        try:
            _private_dir(Path(xdg), create=False)
            return _private_dir(Path(xdg) / "gpujob", create)
        except NoDaemon:
            pass
    return _private_dir(Path(f"/tmp/gpujob-{os.getuid()}"), create)


def socket_path(create: bool = True) -> Path:
    return runtime_dir(create) / "conn.sock"


def find_inventory(explicit: str | None) -> str | None:
    """gpujob.inventory.find_inventory without its imports: the absolute inventory path,
    or None for the built-in one. A path that is not a file raises NoDaemon (the full
    CLI says so in its own words)."""
    for given in (explicit, os.environ.get("GPUJOB_HOSTS")):
        if given:
            path = Path(given).expanduser()
            if not path.is_file():
                raise NoDaemon(f"no such file: {path}")
            return str(path.resolve())
    config = Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config")
    for path in (Path("hosts.yaml"), config / "gpujob" / "hosts.yaml"):
        if path.is_file():
            return str(path.resolve())
    return None


def code_stamp() -> str:
    """Which gpujob this is: a daemon whose code differs (an upgrade, an edit) hands over."""
    pkg = Path(__file__).resolve().parent.parent
    newest = 0
    for sub in (pkg, pkg / "cli", pkg / "conn", pkg / "transport"):
        try:
            with os.scandir(sub) as it:
                for e in it:
                    if e.name.endswith(".py"):
                        newest = max(newest, e.stat().st_mtime_ns)
        except OSError:
            pass
    return f"{pkg}:{newest}:{sys.version_info[:2]}"


def env_view() -> dict:
    return {k: os.environ.get(k) for k in ENV_KEYS}
