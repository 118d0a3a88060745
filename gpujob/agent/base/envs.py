"""Wheel profiles as venvs and per-profile compile caches (stdlib only).

The command builders here are pure and shared: the supervisor runs them in the
container, and ``gpujob submit --plan`` prints the very same argv lists.

Layout under the gpujob home ``H`` in the container::

    H/envs/<profile>-<hash>/        one venv per profile; ``.gpujob-ok`` marks it complete
    H/caches/<profile>-<hash>/      inductor/ triton/ torch_extensions/ for that build only
    H/uv-cache/                     uv's download cache, shared by every profile
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import shutil

from gpujob.agent.base.fsio import write_json

OK_MARKER = ".gpujob-ok"
CACHE_VARS = {
    "TORCHINDUCTOR_CACHE_DIR": "inductor",
    "TRITON_CACHE_DIR": "triton",
    "TORCH_EXTENSIONS_DIR": "torch_extensions",
}

VERIFY_SCRIPT = r"""
import json, os, sys
from importlib import metadata
out = {"python": sys.version.split()[0], "executable": sys.executable, "packages": {}, "from": {}}
venv = os.path.realpath(sys.prefix)
for name in sys.argv[1:]:
    try:
        dist = metadata.distribution(name)
        out["packages"][name] = dist.version
        where = os.path.realpath(str(dist.locate_file("")))
        out["from"][name] = "venv" if where.startswith(venv + os.sep) else where
    except metadata.PackageNotFoundError:
        out["packages"][name] = None
if "torch" in sys.argv[1:] and out["packages"]["torch"]:
    import torch
    out["torch"] = {"version": torch.__version__, "cuda": torch.version.cuda,
                    "file": torch.__file__}
print(json.dumps(out))
"""

# Run by the base interpreter: a venv made from an interpreter that is itself a venv
# (/opt/torch/.venv/bin/python3) would only see the *root* interpreter's packages, so
# the base's own site-packages go into a .pth file of the new venv. A .pth entry is
# appended after the venv's site-packages: the venv's own packages still win.
LINK_BASE_SCRIPT = r"""
import glob, os, site, sys
venv = sys.argv[1]
dirs = [d for d in site.getsitepackages() if os.path.isdir(d)]
targets = glob.glob(os.path.join(venv, "lib", "python*", "site-packages"))
if len(targets) != 1:
    sys.exit("no single site-packages in %s: %s" % (venv, targets))
with open(os.path.join(targets[0], "_gpujob_base.pth"), "w") as f:
    f.write("".join(d + "\n" for d in dirs))
print("linked %s" % ", ".join(dirs))
"""
BASE_PTH = "_gpujob_base.pth"


def env_dir(home: str, key: str) -> str:
    return os.path.join(home, "envs", key)


def cache_dir(home: str, key: str) -> str:
    return os.path.join(home, "caches", key)


def cache_env(home: str, key: str) -> dict:
    """TORCHINDUCTOR_CACHE_DIR, TRITON_CACHE_DIR and TORCH_EXTENSIONS_DIR for one profile."""
    base = cache_dir(home, key)
    return {var: os.path.join(base, sub) for var, sub in CACHE_VARS.items()}


WARM_MARKER = ".gpujob-warm"


def keyed_command(command, ignore: list):
    """The warmup command as its cache is keyed: without the ``ignore`` flags and their
    values (``--flag V``, ``--flag=V``, ``key=V``), which change nothing compiled."""
    if not ignore:
        return command
    if isinstance(command, list):
        words = [str(w) for w in command]
    else:
        try:
            words = shlex.split(command or "")
        except ValueError:
            return command
    out, skip = [], False
    for w in words:
        if skip:
            skip = False
            if not w.startswith("-"):
                continue
        name = w.split("=", 1)[0]
        if name in ignore:
            skip = "=" not in w and w.startswith("-")  # --flag V: V goes too
            continue
        out.append(w)
    return out


def warm_hash(warmup: dict, gpus: list, profile: dict, env_key: str) -> str:
    """What a warmup's result depends on: its command (less its ``ignore_flags``) and GPUs,
    the profile's venv (env_key) and env. A change of any of them makes the cache cold again."""
    data = {"command": keyed_command(warmup.get("command"), list(warmup.get("ignore_flags") or [])),
            "per_gpu": warmup.get("per_gpu"), "gpus": gpus,
            "env_key": env_key, "env": profile.get("env") or {}}
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]


def warm_state(home: str, key: str, digest: str) -> str:
    """``warm`` when a successful warmup with this hash left its marker in the
    profile's cache; else ``cold (no marker)`` or ``cold (marker of another warmup)``."""
    try:
        with open(os.path.join(cache_dir(home, key), WARM_MARKER)) as f:
            got = json.load(f).get("hash")
    except (OSError, ValueError, AttributeError):
        return "cold (no marker)"
    return "warm" if got == digest else "cold (marker of another warmup or profile)"


def mark_warm(home: str, key: str, digest: str, **info) -> None:
    os.makedirs(cache_dir(home, key), exist_ok=True)
    write_json(os.path.join(cache_dir(home, key), WARM_MARKER), dict(info, hash=digest))


def is_installed(home: str, key: str) -> bool:
    return os.path.exists(os.path.join(env_dir(home, key), OK_MARKER))


def pin_of(requirement: str) -> tuple[str, str]:
    """``torch==2.11.0+cu128`` → (``torch``, ``2.11.0+cu128``)."""
    name, _, version = requirement.partition("==")
    name = re.split(r"[\[;\s]", name.strip(), maxsplit=1)[0]
    return normalize(name), version.split(";")[0].strip()


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def venv_python(profile: dict, agent_python: str) -> str:
    """The interpreter a profile's venv is built on: the profile's ``python`` or the
    agent's own. The plan (``agent_python`` = the target's) and the supervisor
    (``sys.executable``) both ask this function."""
    return profile.get("python") or agent_python


def build_commands(profile: dict, venv: str, python: str, *, uv: str | None, uv_cache: str,
                   common_requirements: list, constraints_file: str | None = None,
                   profile_requirements_file: str | None = None, no_deps: list | None = None) -> list:
    """The argv lists that create ``venv`` and install a profile into it.

    With uv: ``uv venv`` then ``uv pip install`` of the pinned packages from the
    profile's index (and its extra indexes and ``find_links`` folders), then the job's
    common requirements from the default index with the profile's index as an extra one,
    the pins held as constraints so a
    common requirement can never swap the torch build; then the ``no_deps`` requirements
    the same way with ``--no-deps``. Without uv: the same with
    ``python3 -m venv`` and pip.
    """
    vpy = os.path.join(venv, "bin", "python")
    python = venv_python(profile, python)
    extras = [a for url in profile.get("extra_index_urls") or [] for a in ("--extra-index-url", url)]
    extras += [a for url in profile.get("find_links") or [] for a in ("--find-links", url)]
    pins = list(profile.get("packages") or [])
    inherit = bool(profile.get("system_site_packages"))
    ssp = ["--system-site-packages"] if inherit else []
    if uv:
        base = [uv, "pip", "install", "--python", vpy, "--cache-dir", uv_cache]
        cmds = [[uv, "venv", "--python", python, *ssp, "--cache-dir", uv_cache, venv]]
    else:
        base = [vpy, "-m", "pip", "install", "--disable-pip-version-check"]
        # nothing to install: no pip needed (a base without ensurepip can still make the venv)
        bare = ([] if pins or profile_requirements_file or common_requirements or no_deps
                else ["--without-pip"])
        cmds = [[python, "-m", "venv", *ssp, *bare, venv]]
    if inherit:
        cmds.append(link_base_command(python, venv))
    index = ["--index-url", profile["index_url"]] if profile.get("index_url") else []
    if pins or profile_requirements_file:
        step = base + index + extras + pins
        if profile_requirements_file:
            step += ["-r", profile_requirements_file]
        cmds.append(step)
    if common_requirements:
        step = base + (["--extra-index-url", profile["index_url"]] if index else []) + extras + \
            (["-c", constraints_file] if constraints_file else [])
        if uv:
            step += ["--index-strategy", "unsafe-best-match"]
        cmds.append(step + list(common_requirements))
    if no_deps:  # named packages without their declared dependencies, the pins still constraints
        step = base + (["--extra-index-url", profile["index_url"]] if index else []) + extras + \
            (["-c", constraints_file] if constraints_file else [])
        if uv:
            step += ["--index-strategy", "unsafe-best-match"]
        cmds.append(step + ["--no-deps"] + list(no_deps))
    return cmds


def link_base_command(python: str, venv: str) -> list:
    return [python, "-c", LINK_BASE_SCRIPT, venv]


def verify_names(profile: dict) -> list:
    """What the verify step asks the venv about: the pins, and torch whenever the
    profile says ``cuda:`` (a torch from the base interpreter is checked too)."""
    names = [pin_of(p)[0] for p in profile.get("packages") or []]
    if profile.get("cuda") and "torch" not in names:
        names.append("torch")
    return names


def verify_command(venv: str, profile: dict) -> list:
    return [os.path.join(venv, "bin", "python"), "-c", VERIFY_SCRIPT, *verify_names(profile)]


def check_verify(profile: dict, report: dict) -> list:
    """Mismatches between what the profile pins and what the venv holds (empty = fine)."""
    problems = []
    if profile.get("cuda") and not report.get("packages", {}).get("torch"):
        problems.append(f"torch is not importable in the venv, the profile says cuda {profile['cuda']}")
    for req in profile.get("packages") or []:
        name, want = pin_of(req)
        got = report.get("packages", {}).get(name)
        if got is None:
            problems.append(f"{name} is not installed")
        elif got != want:
            problems.append(f"{name} is {got}, the profile pins {want}")
    torch = report.get("torch")
    if torch:
        pinned = dict(pin_of(p) for p in profile.get("packages") or []).get("torch")
        if pinned and torch["version"] != pinned:
            problems.append(f"torch.__version__ is {torch['version']}, the profile pins {pinned}")
        cuda = profile.get("cuda")
        got = torch.get("cuda") or ""
        if cuda and got != cuda and not got.startswith(cuda + "."):
            problems.append(f"torch.version.cuda is {torch.get('cuda')}, the profile says {cuda}")
    return problems


def tree_stats(path: str) -> dict:
    """bytes, files, shared (bytes of files with other hard links) and newest mtime."""
    out = {"bytes": 0, "files": 0, "shared": 0, "newest": 0.0}
    for root, _dirs, files in os.walk(path):
        for f in files:
            try:
                st = os.lstat(os.path.join(root, f))
            except OSError:
                continue
            out["bytes"] += st.st_size
            out["files"] += 1
            out["newest"] = max(out["newest"], st.st_mtime)
            if st.st_nlink > 1:
                out["shared"] += st.st_size
    return out


def dir_size(path: str) -> int:
    """Apparent bytes of the files under ``path``."""
    return tree_stats(path)["bytes"]


def read_marker(home: str, key: str) -> dict:
    try:
        with open(os.path.join(env_dir(home, key), OK_MARKER)) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


def remove_tree(path: str) -> None:
    shutil.rmtree(path, ignore_errors=True)
