"""What every recipe is made of: the ``Recipe`` record, its error, and the helpers that read
a trainer's command line (flags, dotted overrides) and append to it. Pure."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from typing import Callable

from gpujob.agent.base.placeholders import command_script

NOT_PROVEN = "not yet proven on a GPU"


class RecipeError(ValueError):
    """A spec that a recipe cannot complete: (dotted key, message)."""

    def __init__(self, key: str, message: str):
        super().__init__(message)
        self.key = key


def argv_of(command) -> list:
    """A train command as its words (a string split as a shell would, else on spaces)."""
    if isinstance(command, list):
        return [str(a) for a in command]
    try:
        return shlex.split(command or "")
    except ValueError:
        return str(command or "").split()


SAFE = re.compile(r"[A-Za-z0-9_./=:+,@%{}-]+")


def append(command, args: list):
    """The command with ``args`` appended (a string gets them shell-quoted; a word of
    safe characters stays as it is, so a ``{workdir}`` placeholder is left bare for
    gpujob to quote when it substitutes it)."""
    if isinstance(command, list):
        return list(command) + args
    words = " ".join(a if SAFE.fullmatch(a) else shlex.quote(a) for a in args)
    return f"{command} {words}" if args else command


def flag(argv: list, *names: str) -> str | None:
    """The value of ``--name V`` / ``--name=V`` (the last one given), else None."""
    found = None
    for i, a in enumerate(argv):
        for n in names:
            if a == n and i + 1 < len(argv):
                found = argv[i + 1]
            elif a.startswith(n + "="):
                found = a[len(n) + 1:]
    return found


def dotted(argv: list, key: str) -> str | None:
    """A SpecForge-style ``key=value`` override (the last one), else None."""
    found = None
    for a in argv:
        if a.startswith(key + "="):
            found = a[len(key) + 1:]
    return found


def as_int(text: str | None) -> int | None:
    return int(text) if text is not None and re.fullmatch(r"\d+", text) else None


def standby(command, preload: list) -> dict:
    return {"standby": {"preload": preload}} if command_script(command) is not None else {}


def own_rate(data: dict, fmt: str) -> bool:
    """Whether the spec reads its rate another way (its own ``throughput.format`` or a
    metrics file): then the recipe's rate keys (format, pattern, tokens per step) yield."""
    tp = data.get("throughput") or {}
    return isinstance(tp, dict) and (tp.get("source") == "file" or tp.get("format") not in (None, fmt))


#: What every torch trainer's fresh interpreter imports before its first step (the standby's
#: preload starts with these): each import touches no GPU.
COMPILE = ["torch", "torch._dynamo", "torch._inductor.compile_fx"]


@dataclass(frozen=True)
class Recipe:
    name: str
    trainer: str  # the package (or project) whose conventions these are
    revision: int  # this recipe's own version: job.json records it
    read_from: str  # the trainer versions the conventions were read from
    proven_on: str  # the versions a GPU run proved (NOT_PROVEN until the device run)
    summary: str
    derive: Callable[[dict], dict] = field(repr=False)  # the spec's data -> the recipe's fragment
    versions: tuple = ()  # the trainer's versions these conventions hold for: doctor --spec warns on others
    #: the standby's preloads (agent/supervisor/standby.py): what a fresh interpreter of the
    #: trainer imports before its first step; none, no standby
    preload: tuple = ()
    sample_command: str = ""  # `gpujob recipes` shows what the recipe sets for this command

    def version_note(self, installed: str | None) -> str | None:
        """None when ``installed`` is a version these conventions hold for (a listed
        version or a release of it: 5.17 covers 5.17.x); else why doctor warns."""
        if installed is None or not self.versions:
            return None
        if any(installed == v or installed.startswith(v + ".") for v in self.versions):
            return None
        return (f"{self.trainer} {installed} is installed; recipe {self.name} (revision {self.revision}) "
                f"holds for {', '.join(self.versions)} ({self.proven_on})")

    def info(self) -> dict:
        return {"name": self.name, "trainer": self.trainer, "revision": self.revision,
                "read_from": self.read_from, "proven_on": self.proven_on}
