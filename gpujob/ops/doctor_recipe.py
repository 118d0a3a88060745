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
        return [Check("recipe", CheckStatus.OK, f"{r.trainer} is a repository (its train.py, shipped by sync), "
                      "not a package: no version to check")]
    out = []
    for profile, version in installed.items():
        if version is None:
            out.append(Check(f"recipe {profile}", CheckStatus.OK, f"venv not built yet: {r.trainer}'s version is "
                             "checked once it is"))
        elif version == "-":
            out.append(Check(f"recipe {profile}", CheckStatus.WARN, f"{r.trainer} is not installed in the venv",
                             f"recipe {r.name} expects {r.trainer} {', '.join(r.versions) or ''}".strip()))
        else:
            note = r.version_note(version)
            out.append(Check(f"recipe {profile}", CheckStatus.WARN if note else CheckStatus.OK,
                             note or f"{r.trainer} {version} (recipe {r.name} revision {r.revision})",
                             "its conventions may have changed: check `gpujob submit SPEC --plan` against the "
                             "trainer's output" if note else ""))
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
