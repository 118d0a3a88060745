"""The environment a job's warmup and trainer get (stdlib only).

The same on every target: the container's *login* environment (what ``bash -l``
sets up from a clean slate: never the variables of whoever started the agent,
such as the CLI's PYTHONPATH or VIRTUAL_ENV on the local target, or the Proxmox
host's that ``pct exec`` carries in), then the variables the inventory lets pass
(``env_passthrough``: glob patterns, e.g. ``NCCL_*``, that a box requires its
programs to keep), then the spec's ``env``, the profile's ``env``, the
per-profile cache variables, gpujob's own, and the venv first on PATH.
"""

from __future__ import annotations

import fnmatch
import os
import subprocess

DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
LOGIN_KEEP = ("HOME", "USER", "LOGNAME", "SHELL", "LANG", "LC_ALL", "TERM")
# never taken from the login environment: they would point the job at another venv/python
NEVER = ("VIRTUAL_ENV", "PYTHONHOME", "PYTHONPATH", "CONDA_PREFIX", "PYTHONSTARTUP", "OLDPWD", "PWD",
         "SHLVL", "_")


def login_command(environ: dict) -> list:
    """``env -i`` with the few variables a login needs, then a login shell printing its env."""
    shell = "/bin/bash" if os.path.exists("/bin/bash") else "/bin/sh"
    keep = [f"{k}={environ[k]}" for k in ("HOME", "USER", "LOGNAME") if k in environ]
    if "HOME" not in environ:
        keep.append("HOME=/root" if os.geteuid() == 0 else "HOME=/")
    # the marker: what a profile prints on stdout (a motd, an echo) comes before it, never read as env
    return ["env", "-i", *keep, shell, "-l", "-c", f"printf '\\0{MARK}\\0'; env -0"]


MARK = "GPUJOB-LOGIN-ENV"


def parse_env0(data: bytes) -> dict:
    out = {}
    for item in data.split(b"\0"):
        key, sep, value = item.decode("utf-8", "replace").partition("=")
        if sep and key:
            out[key] = value
    return out


def login_env(environ: dict | None = None, timeout: float = 15.0) -> tuple[dict, str]:
    """The login environment and where it came from ("login shell" or a fallback)."""
    environ = dict(os.environ if environ is None else environ)
    try:
        p = subprocess.run(login_command(environ), stdin=subprocess.DEVNULL, capture_output=True,
                           timeout=timeout)
        marker = f"\0{MARK}\0".encode()
        _noise, found, printed = p.stdout.rpartition(marker)
        env = parse_env0(printed) if found else {}
        if env.get("PATH"):
            return env, "login shell"
        said = " | ".join(ln.strip() for ln in p.stderr.decode("utf-8", "replace").splitlines()[-2:])[:200]
        why = (f"exit {p.returncode}, " + ("printed no PATH" if found else "printed no environment")
               + (f"; it said: {said}" if said else ""))
    except (OSError, subprocess.TimeoutExpired) as e:
        why = type(e).__name__
    env = {k: environ[k] for k in LOGIN_KEEP if k in environ}
    env["PATH"] = DEFAULT_PATH
    return env, f"fallback ({why}): PATH={DEFAULT_PATH}"


def passed_through(environ: dict, patterns: list) -> dict:
    """The variables of ``environ`` that match one of the glob ``patterns``."""
    return {k: v for k, v in environ.items() if any(fnmatch.fnmatchcase(k, p) for p in patterns or ())}


def job_env(login: dict, passthrough: dict, layers: list, venv: str, extra: dict | None = None) -> dict:
    """Pure: login env, minus NEVER, plus the pass-through, plus each layer in order
    (spec env, profile env, caches, gpujob's own), the venv first on PATH, then ``extra``."""
    env = {k: v for k, v in login.items() if k not in NEVER}
    env.update(passthrough)
    for layer in layers:
        env.update({k: str(v) for k, v in (layer or {}).items()})
    path = env.get("PATH") or DEFAULT_PATH
    env.update(VIRTUAL_ENV=venv, PATH=os.path.join(venv, "bin") + os.pathsep + path, PYTHONUNBUFFERED="1")
    env.pop("PYTHONHOME", None)
    # a hung trainer's SIGABRT writes its stacks (agent/supervisor/stacks.py)
    env.setdefault("PYTHONFAULTHANDLER", "1")
    env.update(extra or {})
    return env
