"""`doctor --spec`: the trainer version a spec's recipe finds in each built venv."""

from __future__ import annotations

from gpujob.agent.base import envs
from gpujob.ops.doctor import Check, CheckStatus
from gpujob.spec.recipes.registry import RECIPES

VERSION_SCRIPT = ("import importlib.metadata as m, sys\n"
                  "try:\n    print(m.version(sys.argv[1]))\nexcept m.PackageNotFoundError:\n    print('-')")


#: recipes whose trainer is a repository's script, not an installed package: no version to look up
REPOS = {"nanogpt"}


def judge(recipe: str, installed: dict) -> list[Check]:
    """{profile: version | None (no venv yet) | '-' (not installed)} -> one check per profile."""
    r = RECIPES[recipe]
    if recipe in REPOS:
        return [Check("recipe", CheckStatus.OK,
                      f"{r.trainer} is a repository (its train.py, shipped by sync), not a package: no "
                      f"version to check")]
    out = []
    for profile, version in installed.items():
        if version is None:
            out.append(Check(f"recipe {profile}", CheckStatus.OK,
                             f"venv not built yet: {r.trainer}'s version is "
                             "checked once it is"))
        elif version == "-":
            out.append(Check(f"recipe {profile}", CheckStatus.WARN,
                             f"{r.trainer} is not installed in the venv",
                             f"recipe {r.name} expects {r.trainer} {', '.join(r.versions) or ''}".strip()))
        else:
            note = r.version_note(version)
            out.append(Check(f"recipe {profile}", CheckStatus.WARN if note else CheckStatus.OK,
                             note or f"{r.trainer} {version} (recipe {r.name} revision {r.revision})",
                             "its conventions may have changed: check `gpujob submit SPEC --plan` against "
                             "the trainer's output" if note else ""))
    return out


def gather(target, spec) -> dict:
    """{profile: the recipe's trainer version in its venv} (None: no venv built)."""
    r = RECIPES[spec.recipe]
    found: dict = {}
    if spec.recipe in REPOS:
        return found
    for p in spec.profiles:
        venv = envs.env_dir(target.home, spec.env_key(p.name))
        res = target.run([f"{venv}/bin/python", "-c", VERSION_SCRIPT, r.trainer], timeout=60)
        text = res.stdout.decode(errors="replace").strip().splitlines()
        found[p.name] = text[-1][:40] if res.ok and text else None
    return found


#: the script a profile's Python runs to find the command's program on the job's PATH:
#: the venv's bin first, then the PATH a login shell of the container gives
WHICH_SCRIPT = ("import os, shutil, subprocess, sys\n"
                "venv_bin, prog = sys.argv[1], sys.argv[2]\n"
                "try:\n"
                "    login = subprocess.run(['bash', '-lc', 'printf %s \"$PATH\"'], capture_output=True,\n"
                "                           timeout=20).stdout.decode(errors='replace')\n"
                "except (OSError, subprocess.SubprocessError):\n"
                "    login = ''\n"
                "path = os.pathsep.join(p for p in (venv_bin, login or os.environ.get('PATH', '')) if p)\n"
                "print(shutil.which(prog, path=path) or '-')\n")


def program(command) -> str | None:
    """The program a train command starts (its first word after VAR=value and ``env``),
    or None when it is a path or cannot be told (a shell construct)."""
    import shlex
    try:
        argv = shlex.split(command) if isinstance(command, str) else [str(a) for a in command]
    except ValueError:
        return None
    while argv and (argv[0] == "env" or ("=" in argv[0] and not argv[0].startswith("="))):
        argv = argv[1:]
    if not argv or "/" in argv[0] or argv[0] in ("(", "{", "if", "for", "while", "exec", "cd"):
        return None
    return argv[0]


def program_checks(found: dict, prog: str | None) -> list[Check]:
    """{profile: where PROG resolves ('-': nowhere) or None (no venv yet)} -> one check each."""
    out = []
    for profile, where in found.items():
        if prog is None or where is None:
            continue
        if where == "-":
            fix = ("write `python -m torch.distributed.run` for torchrun (the same launcher)"
                   if prog == "torchrun"
                   else f"install {prog} in the profile, or start the command with its full path")
            out.append(Check(f"program {profile}", CheckStatus.FAIL,
                             f"{prog} is not on the job's PATH in profile {profile} (the venv's bin, then "
                             f"the container's login PATH): the job would end with `command not found`", fix))
        else:
            out.append(Check(f"program {profile}", CheckStatus.OK, f"{prog}: {where}"))
    return out


def gather_program(target, spec, prog: str | None) -> dict:
    """{profile: where the command's program resolves on the job's PATH} (None: no venv built)."""
    found: dict = {}
    if prog is None:
        return found
    for p in spec.profiles:
        venv = envs.env_dir(target.home, spec.env_key(p.name))
        res = target.run([f"{venv}/bin/python", "-c", WHICH_SCRIPT, f"{venv}/bin", prog], timeout=60)
        text = res.stdout.decode(errors="replace").strip().splitlines()
        found[p.name] = text[-1][:200] if res.ok and text else None
    return found
