"""Where a checkpoint glob may point (stdlib only; spec validation on the laptop and
the agent's submit, which knows the real home, both call ``refusal``).

Checkpoints may live outside the workdir (a data volume is common), but a glob
(``train.checkpoint.path``) is refused when
- a component is ``..`` (it escapes whatever it is relative to), or it holds a
  control character;
- its fixed part (the components before the first one holding ``*``, ``?`` or ``[``)
  is ``/``, one of ``SYSTEM_TREES`` or inside one, or exactly one of ``SYSTEM_DIRS``
  (their subdirectories stay usable: ``/root/ckpt/*`` or ``/mnt/data/*``);
- its fixed part is gpujob's home or a directory above it, or inside one of the
  home's own directories (``HOME_OWN``: jobs, venvs, caches, ledgers …; the default
  workdir under ``<home>/work/`` is fine).
"""

from __future__ import annotations

import os
import posixpath
import re

#: never under these (the whole tree)
SYSTEM_TREES = ("/bin", "/boot", "/dev", "/etc", "/lib", "/lib32", "/lib64", "/libx32", "/proc", "/run",
                "/sbin", "/sys", "/usr", "/var")
#: never these directories themselves (a subdirectory is fine)
SYSTEM_DIRS = ("/", "/root", "/home", "/mnt", "/media", "/opt", "/srv", "/tmp")
#: gpujob's own directories under its home
HOME_OWN = ("jobs", "envs", "caches", "snapshots", "ledger", "bin", "uv-cache", "checkpoints", "proofs",
            ".gc")

_GLOB = re.compile(r"[*?\[]")
_PLACEHOLDER = re.compile(r"\{[a-z_.]+\}")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def fixed_part(pattern: str) -> str:
    """The leading components of ``pattern`` that hold no glob character."""
    head = []
    for part in pattern.split("/"):
        if _GLOB.search(part):
            break
        head.append(part)
    fixed = "/".join(head)
    return fixed or ("/" if pattern.startswith("/") else ".")


def _inside(path: str, top: str) -> bool:
    return path == top or path.startswith(top.rstrip("/") + "/")


def refusal(pattern: str, workdir: str | None = None, home: str | None = None) -> str | None:
    """Why ``pattern`` may not name checkpoints (one phrase), or None. ``workdir``
    (absolute, when known) is what a relative pattern is relative to; ``{workdir}``
    in the pattern stands for it."""
    if _CONTROL.search(pattern):
        return "holds a control character"
    if ".." in pattern.split("/"):
        return "a component is '..': it escapes the directory it names; give an absolute path instead"
    text = pattern
    if workdir:
        text = text.replace("{workdir}", workdir)
    if text.startswith("{workdir}"):  # unknown workdir: under the home, checked there
        return None
    if not text.startswith("/"):
        if not (workdir and workdir.startswith("/")):
            return None
        text = posixpath.join(workdir, text)
    text = _PLACEHOLDER.sub("x", text)  # {profile}, {job_id}: one plain component each
    fixed = posixpath.normpath(fixed_part(text))
    if fixed == "/":
        return "it names the container's root '/' (every system directory would match)"
    for top in SYSTEM_TREES:
        if _inside(fixed, top):
            return f"it is under {top}, a system directory"
    if fixed in SYSTEM_DIRS:
        return f"it names {fixed} itself; name a directory under it"
    if home:
        home = posixpath.normpath(home)
        if _inside(home, fixed):
            return f"it names gpujob's home {home}" + (" or a directory above it" if fixed != home else "")
        for own in HOME_OWN:
            if _inside(fixed, posixpath.join(home, own)):
                return f"it is inside {posixpath.join(home, own)}, gpujob's own directory"
    return None


_STEP = re.compile(r"(?:global_step|step|iter|it|epoch)[_-]?(\d+)", re.I)
_LAST_NUMBER = re.compile(r"(\d+)(?=\D*$)")


def step_of(path: str):
    """The step a checkpoint's name says (``ckpt_step_400.pt``, ``iter-12``,
    ``ckpt-000400.pt``), or None."""
    name = os.path.basename(path.rstrip("/"))
    m = _STEP.search(name) or _LAST_NUMBER.search(os.path.splitext(name)[0])
    return int(m.group(1)) if m else None


def fixed_place(path: str, resume_args) -> bool:
    """Whether a trainer resumes from a fixed place by itself: ``train.checkpoint.path``
    names one file or directory (no ``*``, ``?`` or ``[``) and ``resume_args`` have no
    ``{resume_from}`` (nanoGPT's ``--init_from=resume`` loads OUT/ckpt.pt). Then
    ``submit --resume-from``'s checkpoint is copied into that place before the trainer
    starts (agent/supervisor/cksupervise.py ``start_copy``)."""
    return not any(c in path for c in "*?[") and not any("{resume_from}" in str(a) for a in resume_args or [])
