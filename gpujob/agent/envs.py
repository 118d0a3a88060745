"""Wheel profiles as venvs and per-profile compile caches (stdlib only).

The command builders here are pure and shared: the supervisor runs them in the
container, and ``gpujob submit --plan`` prints the very same argv lists.

Layout under the gpujob home ``H`` in the container::

    H/envs/<profile>-<hash>/        one venv per profile; ``.gpujob-ok`` marks it complete
    H/caches/<profile>-<hash>/      inductor/ triton/ torch_extensions/ for that build only
    H/uv-cache/                     uv's download cache, shared by every profile
"""

from __future__ import annotations

import json
import os
import re
import shutil

OK_MARKER = ".gpujob-ok"
CACHE_VARS = {
    "TORCHINDUCTOR_CACHE_DIR": "inductor",
    "TRITON_CACHE_DIR": "triton",
    "TORCH_EXTENSIONS_DIR": "torch_extensions",
}

VERIFY_SCRIPT = r"""
import json, sys
from importlib import metadata
out = {"python": sys.version.split()[0], "packages": {}}
for name in sys.argv[1:]:
    try:
        out["packages"][name] = metadata.version(name)
    except metadata.PackageNotFoundError:
        out["packages"][name] = None
if "torch" in sys.argv[1:] and out["packages"]["torch"]:
    import torch
    out["torch"] = {"version": torch.__version__, "cuda": torch.version.cuda}
print(json.dumps(out))
"""


def env_dir(home: str, key: str) -> str:
    return os.path.join(home, "envs", key)


def cache_dir(home: str, key: str) -> str:
    return os.path.join(home, "caches", key)


def cache_env(home: str, key: str) -> dict:
    """TORCHINDUCTOR_CACHE_DIR, TRITON_CACHE_DIR and TORCH_EXTENSIONS_DIR for one profile."""
    base = cache_dir(home, key)
    return {var: os.path.join(base, sub) for var, sub in CACHE_VARS.items()}


def cache_is_cold(home: str, key: str) -> bool:
    """Cold when no compile cache of this profile holds a single file yet."""
    for path in cache_env(home, key).values():
        if os.path.isdir(path):
            for _root, _dirs, files in os.walk(path):
                if files:
                    return False
    return True


def is_installed(home: str, key: str) -> bool:
    return os.path.exists(os.path.join(env_dir(home, key), OK_MARKER))


def pin_of(requirement: str) -> tuple[str, str]:
    """``torch==2.11.0+cu128`` → (``torch``, ``2.11.0+cu128``)."""
    name, _, version = requirement.partition("==")
    name = re.split(r"[\[;\s]", name.strip(), maxsplit=1)[0]
    return normalize(name), version.split(";")[0].strip()


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def build_commands(profile: dict, venv: str, python: str, *, uv: str | None, uv_cache: str,
                   common_requirements: list, constraints_file: str | None = None,
                   profile_requirements_file: str | None = None) -> list:
    """The argv lists that create ``venv`` and install a profile into it.

    With uv: ``uv venv`` then ``uv pip install`` of the pinned packages from the
    profile's index, then the job's common requirements from the default index
    with the profile's index as an extra one, the pins held as constraints so a
    common requirement can never swap the torch build. Without uv: the same with
    ``python3 -m venv`` and pip.
    """
    vpy = os.path.join(venv, "bin", "python")
    extras = [a for url in profile.get("extra_index_urls") or [] for a in ("--extra-index-url", url)]
    pins = list(profile["packages"])
    if uv:
        base = [uv, "pip", "install", "--python", vpy, "--cache-dir", uv_cache]
        cmds = [[uv, "venv", "--python", python, "--cache-dir", uv_cache, venv]]
    else:
        base = [vpy, "-m", "pip", "install", "--disable-pip-version-check"]
        cmds = [[python, "-m", "venv", venv]]
    step = base + ["--index-url", profile["index_url"]] + extras + pins
    if profile_requirements_file:
        step += ["-r", profile_requirements_file]
    cmds.append(step)
    if common_requirements:
        step = base + ["--extra-index-url", profile["index_url"]] + extras + \
            (["-c", constraints_file] if constraints_file else [])
        if uv:
            step += ["--index-strategy", "unsafe-best-match"]
        cmds.append(step + list(common_requirements))
    return cmds


def verify_command(venv: str, profile: dict) -> list:
    names = [pin_of(p)[0] for p in profile["packages"]]
    return [os.path.join(venv, "bin", "python"), "-c", VERIFY_SCRIPT, *names]


def check_verify(profile: dict, report: dict) -> list:
    """Mismatches between what the profile pins and what the venv holds (empty = fine)."""
    problems = []
    for req in profile["packages"]:
        name, want = pin_of(req)
        got = report.get("packages", {}).get(name)
        if got is None:
            problems.append(f"{name} is not installed")
        elif got != want:
            problems.append(f"{name} is {got}, the profile pins {want}")
    torch = report.get("torch")
    if torch:
        want = dict(pin_of(p) for p in profile["packages"]).get("torch")
        if want and torch["version"] != want:
            problems.append(f"torch.__version__ is {torch['version']}, the profile pins {want}")
        cuda = profile.get("cuda")
        if cuda and (torch.get("cuda") or "") != cuda and not (torch.get("cuda") or "").startswith(cuda + "."):
            problems.append(f"torch.version.cuda is {torch.get('cuda')}, the profile says {cuda}")
    return problems


def dir_size(path: str) -> int:
    total = 0
    for root, _dirs, files in os.walk(path):
        for f in files:
            try:
                total += os.lstat(os.path.join(root, f)).st_size
            except OSError:
                pass
    return total


def read_marker(home: str, key: str) -> dict:
    try:
        with open(os.path.join(env_dir(home, key), OK_MARKER)) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


def remove_tree(path: str) -> None:
    shutil.rmtree(path, ignore_errors=True)
