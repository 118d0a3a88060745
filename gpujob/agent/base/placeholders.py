"""Spec commands as the supervisor runs them, and as the plan shows them (stdlib only):
placeholder substitution (quoted once for the shell that reads it), argv building,
and the same values as GPUJOB_* variables. The controller's plan imports these
very functions, so the plan is what runs."""

from __future__ import annotations

import os
import re
import shlex

FLEET_KEYS = ("nnodes", "node_rank", "rdzv_endpoint", "master_addr", "master_port")
PLACEHOLDER = re.compile(r"\{(gpus\.[a-z_][a-z0-9_]*|gpu|profile|job_id|workdir|nnodes|node_rank"
                         r"|rdzv_endpoint|master_addr|master_port|resume_from)\}")


def substitute(text: str, values: dict, quote=None) -> str:
    """Replace ``{gpus.NAME}``, ``{gpu}``, ``{profile}``, ``{job_id}``, ``{workdir}``
    (and for a multi-node job ``{nnodes}``, ``{node_rank}``, ``{rdzv_endpoint}``,
    ``{master_addr}``, ``{master_port}``; in ``train.resume_args`` ``{resume_from}``, the
    checkpoint gpujob chose for a resumed trainer)
    (each value passed through ``quote`` when given); any other braces (``${VAR}``,
    ``{}``) are left alone."""
    def one(m):
        if m.group(1) not in values:
            return m.group(0)
        return quote(values[m.group(1)]) if quote else values[m.group(1)]
    return PLACEHOLDER.sub(one, text)


def quoted_placeholders(text: str) -> list:
    """The placeholders of a shell command string that sit inside quotes (or after a
    backslash): gpujob quotes each value itself, so a quote around it would break it."""
    found, quote, i = [], None, 0
    while i < len(text):
        c = text[i]
        m = PLACEHOLDER.match(text, i)
        if m:
            if quote:
                found.append(m.group(0))
            i = m.end()
            continue
        if c == "\\" and quote != "'":
            i += 2
            continue
        if quote is None and c in "'\"":
            quote = c
        elif c == quote:
            quote = None
        i += 1
    return found


def command_argv(command, values: dict, extra_args=()) -> list:
    """A spec command (a shell string or an argv list) as an argv list. In a shell
    string each substituted value is quoted for that shell (``/root/a b`` stays one
    word, ``x;touch p`` runs nothing); an argv list gets the values as they are."""
    if isinstance(command, str):
        text = substitute(command, values, shlex.quote)
        if extra_args:
            text += " " + shlex.join(list(extra_args))
        shell = "/bin/bash" if os.path.exists("/bin/bash") else "/bin/sh"
        return [shell, "-c", text]
    argv = [substitute(str(a), values) for a in command]
    if is_shell_c(command):  # ["bash", "-c", "cd {workdir} && ..."]: that string is shell too
        argv[2] = substitute(command[2], values, shlex.quote)
    return argv + list(extra_args)


def is_shell_c(argv) -> bool:
    """An argv that hands its third element to a shell: [bash|sh|dash|zsh, -c, SCRIPT, ...]."""
    return (isinstance(argv, list) and len(argv) >= 3 and argv[1] == "-c"
            and os.path.basename(str(argv[0])) in ("bash", "sh", "dash", "zsh"))


def placeholder_env(values: dict) -> dict:
    """The substituted values again as variables: GPUJOB_WORKDIR, GPUJOB_GPU,
    GPUJOB_GPUS_<GROUP>, GPUJOB_PROFILE, GPUJOB_JOB_ID."""
    return {"GPUJOB_" + key.replace(".", "_").upper(): str(value) for key, value in values.items()}


def fleet_values(nnodes: int, rank: int, master_addr: str, master_port: int) -> dict:
    """A multi-node job's placeholder values for node ``rank`` (node 0 is the
    rendezvous host): what torchrun's --nnodes, --node_rank, --rdzv_endpoint need."""
    host = f"[{master_addr}]" if ":" in master_addr else master_addr  # an IPv6 address
    return {"nnodes": str(nnodes), "node_rank": str(rank), "master_addr": master_addr,
            "master_port": str(master_port), "rdzv_endpoint": f"{host}:{master_port}"}


def fleet_env(values: dict) -> dict:
    """The environment torch.distributed reads, from :func:`fleet_values`."""
    return {"NNODES": values["nnodes"], "NODE_RANK": values["node_rank"],
            "MASTER_ADDR": values["master_addr"], "MASTER_PORT": values["master_port"]}


_PYTHON = re.compile(r"python[0-9.]*")


def script_argv(argv: list) -> list | None:
    """The part after the interpreter of a ``python SCRIPT …`` or ``python -m MOD …``
    argv (what the standby runs), or None when it is not such a command."""
    if len(argv) < 2 or not _PYTHON.fullmatch(os.path.basename(argv[0])):
        return None
    if argv[1] == "-m":
        return argv[1:] if len(argv) > 2 else None
    if argv[1].startswith("-") or not argv[1].endswith(".py"):
        return None
    return argv[1:]


def command_script(command) -> list | None:
    """``script_argv`` of a spec command (a shell string is split as a shell would,
    a string with shell syntax beyond words is not a plain python command)."""
    if isinstance(command, str):
        if re.search(r"[;&|<>`$()]", command):
            return None
        try:
            command = shlex.split(command)
        except ValueError:
            return None
    return script_argv(list(command))
