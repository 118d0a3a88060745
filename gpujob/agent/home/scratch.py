"""A warmup's scratch directory (stdlib only): ``warmup.scratch``, a folder in the
workdir that the warmup's trainer writes into (an output dir, a log root), emptied
before each warmup run. HF's example scripts of transformers 4.x refuse to start on a
non-empty ``--output_dir`` that holds no ``checkpoint-N`` (and each warmup's final
``save_model`` leaves a whole model there), so a second cold warmup in the same workdir
(a rollback onto a cold profile, a later job) failed before this.

The folder is moved aside (one rename: it is whole or gone, never half emptied at its
name), then removed; leftovers of a removal cut short by a death are removed next time.
A link at the folder's place, or at any folder between it and the workdir, is never
followed: a link at the place is removed as a link, a link above it refuses the run.
"""

from __future__ import annotations

import os
import shutil

from gpujob.agent.base.proc import die_here

TRASH = ".gpujob-scratch-trash-"


class ScratchError(Exception):
    """The scratch folder cannot be emptied safely (one line)."""


def place(workdir: str, rel: str) -> str:
    """The scratch folder's absolute path (``rel``: relative, checked by the spec)."""
    rel = rel[len("{workdir}/"):] if rel.startswith("{workdir}/") else rel
    path = os.path.normpath(os.path.join(workdir, rel))
    if not path.startswith(os.path.normpath(workdir) + os.sep):
        raise ScratchError(f"warmup.scratch {rel!r} is not inside the workdir {workdir}")
    return path


def empty(workdir: str, rel: str) -> str:
    """Empty (remove) the scratch folder before a warmup run; returns its path."""
    path = place(workdir, rel)
    at = os.path.dirname(path)
    top = os.path.normpath(workdir)
    while at != top and at.startswith(top + os.sep):  # never through a linked folder
        if os.path.islink(at):
            raise ScratchError(f"warmup.scratch {path}: {at} is a link (into another place); not emptied, "
                               "the warmup not run")
        at = os.path.dirname(at)
    parent = os.path.dirname(path)
    try:
        names = os.listdir(parent)
    except FileNotFoundError:
        return path
    for name in names:  # a removal a death cut short
        if name.startswith(TRASH):
            _remove(os.path.join(parent, name))
    if os.path.islink(path) or os.path.isfile(path):
        os.unlink(path)
    elif os.path.isdir(path):
        trash = os.path.join(parent, f"{TRASH}{os.getpid()}")
        os.rename(path, trash)
        die_here("scratch_moved")  # the suite's death point: moved aside, not yet removed
        _remove(trash)
    return path


def _remove(path: str) -> None:
    if os.path.islink(path) or not os.path.isdir(path):
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
    else:
        shutil.rmtree(path, ignore_errors=True)
