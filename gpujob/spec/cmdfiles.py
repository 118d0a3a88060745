"""The laptop files a train command names, and which of them a spec's sync ships.

``gpujob init`` writes a ``sync:`` entry for each (the script, a config file given as
an argument or a flag's value, the modules the script imports from beside it);
``submit --plan`` warns about a named file no sync entry ships: the container's
workdir holds only what sync put there.
"""

from __future__ import annotations

import ast
import posixpath
import shlex
from pathlib import Path

_MAX_SCRIPT = 2_000_000  # bytes of a script read for its imports and file names


def words(command) -> list[str]:
    """A spec command (a shell string or an argv list) as words; ``--k=v`` gives ``v`` too."""
    if isinstance(command, str):
        try:
            argv = shlex.split(command)
        except ValueError:
            argv = command.split()
    else:
        argv = [str(a) for a in command]
    out = []
    for w in argv:
        out.append(w)
        if w.startswith("-") and "=" in w:
            out.append(w.split("=", 1)[1])
    return out


def _relative(word: str) -> bool:
    return bool(word) and not word.startswith(("-", "/", "~", "$")) and "{" not in word \
        and posixpath.normpath(word) not in (".", "..") and not word.startswith("../")


def named_files(command, base: Path) -> list[str]:
    """Relative words of ``command`` that are files under ``base`` (the laptop), in order."""
    seen: list[str] = []
    for w in words(command):
        if _relative(w) and w not in seen:
            try:
                if (base / w).is_file():
                    seen.append(w)
            except OSError:  # a name too long for the file system: not a file
                continue
    return seen


def script_needs(script: Path) -> list[str]:
    """Files beside ``script`` that it obviously needs: the modules it imports from its own
    folder (``from model import GPT`` -> model.py) and the files it opens by a literal name
    there (``open('configurator.py')``); names relative to the script's folder."""
    try:
        tree = ast.parse(script.read_bytes()[:_MAX_SCRIPT])
    except (OSError, SyntaxError, ValueError):
        return []
    here = script.parent
    found: list[str] = []

    def add(name: str) -> None:
        if name not in found and name != script.name:
            found.append(name)
    for node in ast.walk(tree):
        mods: list[str] = []
        if isinstance(node, ast.Import):
            mods = [a.name.split(".")[0] for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            mods = [node.module.split(".")[0]]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and len(node.value) < 200:
            v = node.value
            if _relative(v) and "/" not in v and "\n" not in v and (here / v).is_file():
                add(v)
        for m in mods:
            if (here / f"{m}.py").is_file():
                add(f"{m}.py")
            elif (here / m / "__init__.py").is_file():
                add(m)
    return found


def init_sync(command, cwd: Path) -> list[str]:
    """The laptop paths (relative to ``cwd``, as the command names them) an init'd spec
    ships: the files the command names, then what each named script needs beside it."""
    named = named_files(command, cwd)
    out = list(named)
    for w in named:
        if w.endswith(".py"):
            folder = posixpath.dirname(w)
            for need in script_needs(cwd / w):
                path = posixpath.join(folder, need) if folder else need
                if path not in out:
                    out.append(path)
    return out


def covered(path: str, shipped: list) -> bool:
    """Whether a sync entry puts ``path`` (relative to the workdir) there. ``shipped``:
    (dest folder relative to the workdir, laptop source, file name or None for a folder)."""
    p = posixpath.normpath(path)
    for dest, src, name in shipped:
        d = posixpath.normpath(dest)
        if name is not None:
            if posixpath.normpath(posixpath.join(d, name)) == p:
                return True
        elif d == ".":
            if (Path(src) / p).exists():
                return True
        elif p == d or p.startswith(d + "/"):
            return True
    return False


def unshipped(commands: list, base: Path, shipped: list) -> list[str]:
    """Files that ``commands`` name, present under ``base`` on the laptop, that no sync entry ships."""
    out: list[str] = []
    for command in commands:
        for w in named_files(command, base):
            if not covered(w, shipped) and w not in out:
                out.append(w)
    return out


def plan_warnings(spec, sources) -> list[str]:
    """``submit --plan``'s warnings: each file the train or warmup command names, there on
    the laptop beside the spec, that no sync entry (``sources``: jobs.Source) ships."""
    commands = [spec.train.command] + ([spec.warmup.command] if spec.warmup else [])
    return [f"the command names {f}, which no sync entry ships: the job runs in the container's workdir, "
            f"which holds only what sync ships (add `- {{src: {f}, dest: {f}}}` under sync:)"
            for f in unshipped(commands, spec.spec_dir, [(s.dest, s.src, s.name) for s in sources])]


#: names whose presence means the script's flags come from a framework's parser, not its own list
_FRAMEWORK_PARSERS = ("HfArgumentParser", "LightningCLI", "ArgumentParser(" + "parser_mode", "jsonargparse",
                      "configurator", "hydra", "tyro", "fire", "JobConfig", "ConfigManager", "OmegaConf")


def script_flags(script: Path) -> frozenset | None:
    """The ``--flags`` a script defines with its own argparse (``add_argument('--lr', ...)``);
    None when it has none of its own or parses through a framework (HfArgumentParser,
    LightningCLI, nanoGPT's configurator, ...), whose flags cannot be listed here."""
    try:
        source = script.read_bytes()[:_MAX_SCRIPT]
        tree = ast.parse(source)
    except (OSError, SyntaxError, ValueError):
        return None
    text = source.decode("utf-8", "replace")
    if any(name in text for name in _FRAMEWORK_PARSERS):
        return None
    flags = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "add_argument":
            for a in node.args:
                if isinstance(a, ast.Constant) and isinstance(a.value, str) and a.value.startswith("--"):
                    flags.add(a.value)
                    flags.add(a.value.replace("_", "-"))
                    flags.add(a.value.replace("-", "_").replace("__", "--", 1))
    return frozenset(flags) or None


def flags_of(command) -> list[str]:
    """The ``--flag`` names of a command (``--k=v`` gives ``--k``), in order."""
    out = []
    for w in words(command) if isinstance(command, (str, list)) else []:
        if w.startswith("--") and len(w) > 2:
            name = w.split("=", 1)[0]
            if name not in out:
                out.append(name)
    return out


def invented(added, given, own: frozenset) -> list[str]:
    """The flags ``added`` (a recipe's command or args) has beyond ``given`` (the user's command)
    that the script's own parser (``own``) does not define."""
    before = set(flags_of(given))
    return [f for f in flags_of(added) if f not in before and f not in own]
