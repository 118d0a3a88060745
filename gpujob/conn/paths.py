"""Where the connection daemon lives, and what a request must agree on with it
(stdlib only: the thin client imports this).

One daemon per *environment*, like OpenSSH's ``%C`` in a ControlPath: its socket is
``conn-KEY.sock``, KEY a hash of everything a daemon must agree on with the command
it serves (uid, ENV_KEYS, which gpujob and which Python: :func:`code_stamp`). Two
installs, two terminals with their own ssh-agent or two state directories each keep
their own daemon; none is asked to serve (or end for) another.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import sys

#: seconds a daemon with nothing to do stays up (GPUJOB_CONN_IDLE overrides)
DEFAULT_IDLE = 300.0
#: seconds a daemon told to stop (``gpujob disconnect``, SIGTERM) waits for the commands
#: still running through it before it cuts them (GPUJOB_CONN_DRAIN overrides, 0 to 60)
DEFAULT_DRAIN = 5.0
#: variables that change what a command does on the controller side: a daemon
#: started under other values would act for another user, state dir, ssh-agent or
#: inventory (each is part of the socket's key, and kept in the daemon's environment)
ENV_KEYS = ("HOME", "USER", "XDG_STATE_HOME", "XDG_CONFIG_HOME", "SSH_AUTH_SOCK", "GPUJOB_HOSTS")
#: a Unix socket's path is at most this long (sun_path is 108 bytes with its NUL)
MAX_SOCKET_PATH = 107
#: what rich reads from the environment to decide width, colours and terminal-ness
TERM_KEYS = ("COLUMNS", "LINES", "NO_COLOR", "FORCE_COLOR", "TERM", "COLORTERM", "TTY_COMPATIBLE",
             "TTY_INTERACTIVE", "JUPYTER_COLUMNS", "JUPYTER_LINES")


class NoDaemon(Exception):
    """The kept connection cannot be used here; run the command directly."""


#: set by the console entry point: only the installed ``gpujob`` uses the kept connection
#: (``python -m gpujob.cli.main``, as the tests run it, connects directly)
FROM_ENTRY = False


def disabled() -> bool:
    return os.environ.get("GPUJOB_NO_DAEMON", "") not in ("", "0")


def kept() -> bool:
    """Whether the full CLI's commands go over the kept connection too."""
    return FROM_ENTRY and not disabled()


def drain_seconds() -> float:
    try:
        return min(60.0, max(0.0, float(os.environ.get("GPUJOB_CONN_DRAIN", DEFAULT_DRAIN))))
    except ValueError:
        return DEFAULT_DRAIN


def idle_seconds() -> float:
    try:
        return max(1.0, float(os.environ.get("GPUJOB_CONN_IDLE", DEFAULT_IDLE)))
    except ValueError:
        return DEFAULT_IDLE


def _private_dir(path: str, create: bool) -> str:
    """``path`` when it is a real directory of ours that nobody else may enter."""
    if create:
        try:
            os.mkdir(path, 0o700)
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


def runtime_dir(create: bool = True) -> str:
    """$XDG_RUNTIME_DIR/gpujob when that runtime dir is ours, else /tmp/gpujob-UID; 0700
    and ours, checked (NoDaemon otherwise). Without ``create``, a directory not made yet
    is named all the same (nothing listens there)."""
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    if xdg:
        try:
            _private_dir(xdg, create=False)
        except NoDaemon:
            xdg = None
    path = os.path.join(xdg, "gpujob") if xdg else f"/tmp/gpujob-{os.getuid()}"
    if not create and not os.path.lexists(path):
        return path
    return _private_dir(path, create)


def env_key() -> str:
    """This environment's key: what a daemon must agree on, hashed (16 hex digits)."""
    view = {"uid": os.getuid(), "env": env_view(), "stamp": code_stamp()}
    return hashlib.sha256(json.dumps(view, sort_keys=True).encode()).hexdigest()[:16]


def socket_path(create: bool = True) -> str:
    """This environment's daemon socket (NoDaemon when its path would be too long)."""
    path = os.path.join(runtime_dir(create), f"conn-{env_key()}.sock")
    if len(os.fsencode(path)) > MAX_SOCKET_PATH:
        raise NoDaemon(f"{path} is too long for a Unix socket")
    return path


def starting_marker(path: str) -> str:
    """Beside a socket: the pid of the daemon spawned for it, while it starts."""
    return path[:-len(".sock")] + ".starting"


def find_inventory(explicit: str | None) -> str | None:
    """gpujob.inventory.hosts.find_inventory without its imports: the absolute inventory path,
    or None for the built-in one. A path that is not a file raises NoDaemon (the full
    CLI says so in its own words)."""
    for given in (explicit, os.environ.get("GPUJOB_HOSTS")):
        if given:
            path = os.path.expanduser(given)
            if not os.path.isfile(path):
                raise NoDaemon(f"no such file: {path}")
            return os.path.realpath(path)
    config = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    for path in (os.path.join(config, "gpujob", "hosts.yaml"), "hosts.yaml"):  # the user's first
        if os.path.isfile(path):
            return os.path.realpath(path)
    return None


def code_stamp(pkg: str | None = None) -> str:
    """Which gpujob this is, run by which Python: an upgrade or an edit (a newer module
    file anywhere in the package: the daemon runs the CLI's command bodies, the targets,
    the transports and ships the agent) makes another key, so its commands start a daemon
    of their own; the old daemon serves nobody new and ends when idle."""
    pkg = pkg or os.path.dirname(os.path.dirname(os.path.realpath(__file__)))
    newest = 0
    todo = [pkg]
    while todo:
        try:
            with os.scandir(todo.pop()) as it:
                for e in it:
                    if e.name.endswith(".py"):
                        newest = max(newest, e.stat().st_mtime_ns)
                    elif e.is_dir(follow_symlinks=False) and e.name != "__pycache__" and \
                            not e.name.startswith("."):
                        todo.append(e.path)
        except OSError:
            pass
    return f"{pkg}:{newest}:{sys.version_info[:2]}:{sys.prefix}"


def env_view() -> dict:
    return {k: os.environ.get(k) for k in ENV_KEYS}
