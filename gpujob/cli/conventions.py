"""The command line's manners, kept apart from the commands (cli/main.py).

- A usage error is one line on stderr with a hint, exit 2:
  ``gpujob: No such option: --folow (try 'gpujob logs --help')``; on a command that
  takes a trailing command (``exec``) an unknown option hints at ``--``.
- Global options (those of the root command, e.g. ``--hosts``, ``--accept-new``) are
  accepted after the command too: each command gets a copy that sets the same thing.
- Boolean flags show as flags in ``--help`` (no ``<bool>``).
- ``gpujob completion bash|zsh|fish`` prints the shell completion script (typer's, on
  click's shell completion machinery); the script calls back ``_GPUJOB_COMPLETE=...``.

typer (>= 0.2x) vendors click as ``typer._click``; older typer uses ``click``.
"""

from __future__ import annotations

import copy
import os
import re
import sys
from typing import Optional

import typer

try:  # typer vendors click
    from typer._click import exceptions as cx
except ImportError:  # pragma: no cover - older typer on the real click
    # typer vendors click: mypy may find no click (a venv without it), and sees the name twice; with
    # click installed beside it (huggingface-hub brings it, with tokenizers) the first code is unused
    from click import exceptions as cx  # type: ignore[import-not-found,no-redef,unused-ignore]

PROG = "gpujob"
COMPLETE_VAR = "_GPUJOB_COMPLETE"
SHELLS = ("bash", "zsh", "fish")


def one_line(text: str) -> str:
    from gpujob.errors import one_line as esc
    return esc(" ".join(str(text).split()))


def _trailing_command(cmd) -> bool:
    """Does the command take a command of its own at the end (``exec TARGET -- CMD…``)?"""
    return any(p.param_type_name == "argument" and p.nargs == -1 for p in getattr(cmd, "params", []))


#: other tools' words for gpujob's commands (SkyPilot, Slurm, dstack, docker): an unknown
#: command that is one of them is answered with ours, not with the nearest spelling
SYNONYMS = {"cancel": "stop", "kill": "stop", "down": "stop", "scancel": "stop", "terminate": "stop",
            "queue": "ps", "jobs": "ps", "squeue": "ps", "list": "ps", "launch": "submit", "run": "submit",
            "apply": "submit", "sbatch": "submit", "tail": "logs", "log": "logs", "attach": "logs",
            "check": "doctor", "ssh": "exec", "info": "status", "show": "status", "undo": "rollback"}
_NO_SUCH = re.compile(r"No such command '([^']{1,40})'")


def usage_line(e) -> str:
    """A click usage error as one line, with a hint of where to look."""
    c = getattr(e, "ctx", None)
    path = c.command_path if c is not None else PROG
    msg = one_line(e.format_message())
    m = _NO_SUCH.match(msg)
    if m and m.group(1) in SYNONYMS and path == PROG:
        ours = SYNONYMS[m.group(1)]
        return (f"{PROG}: no command '{m.group(1)}'; gpujob's word for it is '{ours}' (try '{PROG} {ours} "
                f"--help')")
    if isinstance(e, cx.NoSuchOption) and c is not None and _trailing_command(c.command):
        lead = " ".join((a.metavar or a.name).upper() for a in c.command.params
                        if a.param_type_name == "argument" and a.nargs == 1)
        return f"{PROG}: {msg} (put '--' before the command: {path} {lead} -- COMMAND [ARGS...])"
    return f"{PROG}: {msg} (try '{path} --help')"


def _global_copy(opt):
    """``opt`` of the root command, for a subcommand: given there, it sets the root's value
    and runs the root's callback again (it only records the global settings)."""
    dup = copy.copy(opt)
    dup.expose_value = False
    dup.is_eager = False
    dup.rich_help_panel = "Global options (also before the command)"
    name = opt.name

    def cb(cctx, param, value):
        if value is None or (value is False and opt.is_flag) or cctx.resilient_parsing:
            return value
        root = cctx.find_root()
        root.params[name] = value
        if root.command.callback is not None:
            root.invoke(root.command.callback, **root.params)
        return value

    dup.callback = cb
    return dup


def _walk(cmd, globals_: list) -> None:
    from gpujob.cli import fastparams
    for p in cmd.params:
        fastparams.install(p)  # no pydantic for a value there is nothing to convert in
        if getattr(p, "is_flag", False) or getattr(p, "count", False):
            p.metavar = ""  # typer shows <bool> otherwise; a flag takes no value
    if globals_:
        names = {o for p in cmd.params for o in getattr(p, "opts", [])}
        cmd.params.extend(_global_copy(g) for g in globals_ if not names & set(g.opts))
    orig = cmd.get_help_option

    def help_option(c, _orig=orig):
        opt = _orig(c)
        if opt is not None:
            opt.metavar = ""
            fastparams.install(opt)
        return opt

    cmd.get_help_option = help_option
    for sub in getattr(cmd, "commands", {}).values():
        _walk(sub, globals_)


def _json_everywhere(root) -> None:
    """``gpujob --json CMD`` as ``gpujob CMD --json``: the root's ``--json`` becomes the
    default of every command's own ``--json``."""
    own = []

    def collect(cmd):
        own.extend(p for p in cmd.params if "--json" in getattr(p, "opts", ()))
        for sub in getattr(cmd, "commands", {}).values():
            collect(sub)

    collect(root)
    if not own or any("--json" in getattr(p, "opts", ()) for p in root.params):
        return
    flag = copy.copy(own[0])
    flag.name, flag.expose_value, flag.help = "json_all", False, "--json for the command that follows"

    def cb(cctx, param, value):
        if value:
            cctx.meta["gpujob.json"] = True
        return value

    flag.callback = cb
    root.params.insert(len(root.params) - 1 if root.params else 0, flag)

    def default():
        from typer._click.globals import get_current_context
        c = get_current_context(silent=True)
        return bool(c and c.meta.get("gpujob.json"))  # meta is shared by the contexts of one run

    for p in own:
        p.default = default
        p.show_default = False


def build(app: typer.Typer):
    """The click command of ``app``, with the conventions above applied."""
    root = typer.main.get_command(app)
    globals_ = [p for p in root.params if p.param_type_name == "option" and not p.is_eager]
    _json_everywhere(root)
    _walk(root, [])
    for sub in getattr(root, "commands", {}).values():
        _walk(sub, globals_)
    return root


class _Later(type):
    """A stand-in class: called, or asked for an attribute, it imports the real one."""

    def _real(cls):
        import importlib
        return getattr(importlib.import_module(cls._module), cls.__name__)

    def __call__(cls, *args, **kwargs):
        return cls._real()(*args, **kwargs)

    def __getattr__(cls, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return getattr(cls._real(), name)


def _light_help() -> None:
    """typer's help module (typer.rich_utils) imports rich.markdown (markdown-it, pygments:
    ~40 ms) and rich.traceback at its top, for markdown help text and pretty tracebacks,
    neither of which gpujob uses (rich markup, pretty exceptions off). It is imported here
    with stand-ins for those two classes, which import the real ones if ever used; the
    modules themselves stay unimported, so a later import gets the real ones."""
    if "typer.rich_utils" in sys.modules:
        return
    import types
    planted = []
    for module, name in (("rich.markdown", "Markdown"), ("rich.traceback", "Traceback")):
        if module not in sys.modules:
            stand_in = types.ModuleType(module)
            setattr(stand_in, name, _Later(name, (), {"_module": module}))
            sys.modules[module] = stand_in
            planted.append(module)
    try:
        import typer.rich_utils  # noqa: F401
    except Exception:  # pragma: no cover - another typer: it imports its own way later
        sys.modules.pop("typer.rich_utils", None)
    finally:
        for module in planted:
            sys.modules.pop(module, None)


def run(app: typer.Typer, argv: Optional[list] = None, err=None) -> int:
    """Run the command line; usage errors as one line (exit 2). Returns the exit code;
    gpujob's own errors (GpujobError) pass through to the caller."""
    cmd = build(app)
    given = sys.argv[1:] if argv is None else argv
    if "--help" in given or len(given) <= 1:  # help is likely: typer's help module, light
        _light_help()
    if os.environ.get(COMPLETE_VAR):
        _completion_init()
    write = err or (lambda line: print(line, file=sys.stderr))
    try:
        rv = cmd.main(args=argv, prog_name=PROG, complete_var=COMPLETE_VAR, standalone_mode=False)
    except cx.NoArgsIsHelpError:  # `gpujob` alone, `gpujob cache`: typer printed the help; exit 2
        return 2
    except cx.UsageError as e:
        write(usage_line(e))
        return 2
    except cx.ClickException as e:
        write(f"{PROG}: {one_line(e.format_message())}")
        return e.exit_code
    except typer.Abort:
        write("interrupted")
        return 130
    return rv if isinstance(rv, int) else 0


def _completion_init() -> None:
    """typer's completion classes (bash/zsh/fish/powershell) for its scripts' call-back."""
    from typer._completion_classes import completion_init
    completion_init()


def completion_script(shell: str) -> str:
    from typer._completion_shared import get_completion_script
    _completion_init()
    return get_completion_script(prog_name=PROG, complete_var=COMPLETE_VAR, shell=shell)


def completion(shell: str = typer.Argument(..., metavar="bash|zsh|fish", help="the shell"),
               as_json: bool = typer.Option(False, "--json", help="{shell, script} as one JSON object")):
    """Print the shell completion script, e.g. eval "$(gpujob completion bash)" in ~/.bashrc;
    zsh: gpujob completion zsh > ~/.zfunc/_gpujob;
    fish: gpujob completion fish > ~/.config/fish/completions/gpujob.fish."""
    from gpujob.errors import InputError
    if shell not in SHELLS:
        raise InputError(f"completion: expected bash, zsh or fish, got {shell[:40]!r}")
    script = completion_script(shell)
    if as_json:
        import json
        sys.stdout.write(json.dumps({"shell": shell, "script": script}) + "\n")
    else:
        sys.stdout.write(script + "\n")
