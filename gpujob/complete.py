"""A Tab, answered without the full CLI: the shell's completion call-back
(``_GPUJOB_COMPLETE=complete_bash|complete_zsh|complete_fish``, from the scripts
``gpujob completion SHELL`` prints) is served here from the index of commands
(gpujob/complete_table.py, generated from the CLI) and, for values, from this laptop:
target names from the inventory file the command would use, job ids from the local
job index, fixed choices from the index. Stdlib only (typer's completion costs the
whole CLI's start, 1-3 s a Tab on a loaded laptop).

Commands and options are listed as typer's own completion lists them (same order,
same help), in each shell's format; a value with nothing to offer (a path) gives the
shell nothing, so it falls back to file names.
"""

from __future__ import annotations

import os
import re
import shlex
import sqlite3
import sys

from gpujob.complete_table import TABLE


def split(line: str) -> list[str]:
    """Words as the shell gave them; a half-typed quote is kept as it is."""
    lex = shlex.shlex(line, posix=True)
    lex.whitespace_split = True
    lex.commenters = ""
    out = []
    try:
        for token in lex:
            out.append(token)
    except ValueError:
        out.append(lex.token)
    return out


def _option(node: dict, name: str):
    for opt in node["options"]:
        if name in opt[0]:
            return opt
    return None


def items(words: list[str], incomplete: str) -> list[tuple[str, str]]:
    """(value, help) pairs for ``incomplete`` after ``words`` (the words after ``gpujob``)."""
    path, given, positional, dashes, hosts = "", set(), 0, False, None
    words = list(words)
    i = 0
    while i < len(words):
        w, node = words[i], TABLE[path]
        if w == "--" and not dashes:
            dashes = True
        elif not dashes and w.startswith("-") and w != "-":
            name, eq, value = w.partition("=")
            opt = _option(node, name)
            if opt is not None:
                given.add(opt[0][0])
                if opt[1] and not eq and i + 1 < len(words):
                    i += 1
                    value = words[i]
                if name == "--hosts" and (eq or opt[1]):
                    hosts = value
        elif node["commands"] and not node["args"]:
            if not any(c == w for c, _ in node["commands"]):
                break  # no such command: typer answers as for the group itself
            path = f"{path} {w}".strip()
            given, positional = set(), 0
        else:
            positional += 1
        i += 1
    node = TABLE[path]
    if incomplete == "=":
        incomplete = ""
    elif "=" in incomplete and incomplete.startswith("-"):
        name, _, incomplete = incomplete.partition("=")
        words.append(name)
    if not dashes and incomplete.startswith("-"):
        return _commands(node, incomplete) + _options(node, incomplete, given)
    if words and words[-1].startswith("-"):
        opt = _option(node, words[-1])
        if opt is not None and opt[1]:
            return _values(opt[4], incomplete, hosts)
    for n, (nargs, kind) in enumerate(node["args"]):
        if nargs == -1 or n >= positional:
            return _values(kind, incomplete, hosts)
    return _commands(node, incomplete) + (_options(node, incomplete, given)
                                          if incomplete and not incomplete[0].isalnum() else [])


def _commands(node: dict, incomplete: str) -> list[tuple[str, str]]:
    return [(c, h) for c, h in node["commands"] if c.startswith(incomplete)]


def _options(node: dict, incomplete: str, given: set) -> list[tuple[str, str]]:
    return [(name, opt[3]) for opt in node["options"] if opt[2] or opt[0][0] not in given
            for name in opt[0] if name.startswith(incomplete)]


def _values(kind, incomplete: str, hosts: str | None) -> list[tuple[str, str]]:
    if not kind:
        return []
    if kind[0] == "choice":
        found = kind[1:]
    elif kind[0] == "target":
        found = targets(hosts)
    else:
        found = job_ids()
    return [(v, "") for v in found if v.startswith(incomplete)]


def inventory_path(explicit: str | None) -> str | None:
    """The inventory file a command would read (gpujob.inventory.hosts.find_inventory's order)."""
    for given in (explicit, os.environ.get("GPUJOB_HOSTS")):
        if given:
            return os.path.expanduser(given)
    config = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    for path in (os.path.join(config, "gpujob", "hosts.yaml"), "hosts.yaml"):  # the user's first
        if os.path.isfile(path):
            return path
    return None


def targets(explicit: str | None = None) -> list[str]:
    """The inventory's targets as a command accepts them: a container's own name where it
    is on one host, host/name always."""
    path = inventory_path(explicit)
    pairs = [("local", "demo")]  # the built-in inventory
    if path is not None:
        try:
            import yaml
            with open(path, encoding="utf-8") as f:
                data = yaml.safe_load(f)
            pairs = [(h, c) for h, host in (data.get("hosts") or {}).items()
                     for c in (host.get("containers") or {})]
        except Exception:  # a broken file: the command itself will say what is wrong
            return []
    names = [c for _, c in pairs]
    bare = [c for c in dict.fromkeys(names) if names.count(c) == 1]
    return offerable([str(v) for v in bare + [f"{h}/{c}" for h, c in pairs]])


def offerable(values: list) -> list[str]:
    """The values a shell may be offered: a name from hosts.yaml or the index is read here
    without the inventory's checks, so one holding a control character or white space (which
    the inventory refuses, and which would end or split a completion line) is left out."""
    return [v for v in values if isinstance(v, str) and v and v.isprintable()
            and not any(c.isspace() for c in v)]


def job_ids() -> list[str]:
    """This laptop's jobs, the most recent first (the local index, read-only), less the
    phantoms: a row still ``submitting`` whose gpujob died before it asked the container to
    start the job (the container never had it; the next ``ps`` forgets it, and says so)."""
    base = os.environ.get("XDG_STATE_HOME") or os.path.expanduser("~/.local/state")
    db = os.path.join(base, "gpujob", "state.db")
    if not os.path.isfile(db):
        return []
    try:
        con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=2)
        try:
            cols = {r[1] for r in con.execute("PRAGMA table_info(jobs)")}
            if not {"submitter", "asked"} <= cols:  # an index from before: nothing tells a phantom
                return offerable([r[0] for r in con.execute(
                    "SELECT job_id FROM jobs ORDER BY submitted_at DESC LIMIT 200")])
            rows = con.execute("SELECT job_id, state, submitter, asked FROM jobs "
                               "ORDER BY submitted_at DESC LIMIT 200").fetchall()
        finally:
            con.close()
    except sqlite3.Error:
        return []
    return offerable([job for job, state, submitter, asked in rows
                      if not (state == "submitting" and not asked and _gone(submitter))])


def _gone(submitter) -> bool:
    """The gpujob recorded as ``pid:start ticks`` has ended (the index's ``submitter``)."""
    pid, _, ticks = str(submitter or "").partition(":")
    if not pid.isdigit():
        return False  # nothing recorded: never taken for a phantom
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        if os.path.isdir("/proc/self"):
            return True  # no such process
        try:  # no /proc (macOS): the pid alone
            os.kill(int(pid), 0)
        except ProcessLookupError:
            return True
        except OSError:
            return False
        return False
    except IndexError:
        return False
    if fields[0] in ("Z", "X"):
        return True
    return ticks.isdigit() and len(fields) > 19 and fields[19] != ticks


def _args(env: dict) -> tuple[list[str], str]:
    """(complete words after gpujob, the incomplete one) as zsh and fish pass them."""
    line = env.get("_TYPER_COMPLETE_ARGS", "")
    words = split(line)[1:]
    if words and not line.endswith(" "):
        return words[:-1], words[-1]
    return words, ""


def _zsh(s: str) -> str:
    return (s.replace('"', '""').replace("'", "''").replace("$", "\\$").replace("`", "\\`")
            .replace(":", r"\\:"))


def _fish(s: str) -> str:
    return re.sub(r"\s", " ", s)


def answer(instruction: str, env: dict) -> tuple[str | None, int]:
    """(what to print, exit code) for the shell's call-back; None: print nothing."""
    if instruction == "complete_bash":
        words = split(env.get("COMP_WORDS", ""))
        try:
            cword = int(env.get("COMP_CWORD", ""))
        except ValueError:
            return None, 1
        found = items(words[1:cword], words[cword] if cword < len(words) else "")
        return "\n".join(v for v, _ in found), 0
    if instruction == "complete_zsh":
        found = items(*_args(env))
        if not found:
            return "_files", 0
        body = "\n".join(f'"{_zsh(v)}":"{_zsh(h)}"' if h else f'"{_zsh(v)}"' for v, h in found)
        return f"_arguments '*: :(({body}))'", 0
    if instruction == "complete_fish":
        found = items(*_args(env))
        if env.get("_TYPER_COMPLETE_FISH_ACTION") == "is-args":
            return None, 0 if found else 1
        return "\n".join(f"{v}\t{_fish(h)}" if h else v for v, h in found), 0
    return None, 1


def main() -> int | None:
    """The exit code of a Tab answered here; None for another instruction (``source_bash``:
    the full CLI prints the script)."""
    instruction = os.environ.get("_GPUJOB_COMPLETE", "")
    if instruction not in ("complete_bash", "complete_zsh", "complete_fish"):
        return None
    text, code = answer(instruction, dict(os.environ))
    if text is not None:
        sys.stdout.write(text + "\n")
    return code
