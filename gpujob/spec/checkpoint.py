"""The spec's train.checkpoint (spec.py imports it): the checkpoint glob and when a
checkpoint is finished (agent/home/ckregister.py), where a glob may point
(agent/base/ckpaths.py), and ``{resume_from}`` in ``train.resume_args``."""

from __future__ import annotations

from pydantic import model_validator

from gpujob.agent.base.ckpaths import refusal
from gpujob.spec.types import Duration, PathText
from gpujob.yamlsrc import At, Strict, describe


class Checkpoint(Strict):
    path: PathText  # glob, relative to the workdir (or absolute: a data volume): the trainer's checkpoints
    every: Duration  # how often the trainer writes one
    settle: Duration = 2.0  # a checkpoint is finished when it has not changed this long
    done_file: str | None = None  # a directory checkpoint is finished when this file is in it
    save_wait: Duration = 60.0  # a stop/rollback that finds a save in progress waits up to this long

    @model_validator(mode="after")
    def _positive(self) -> Checkpoint:
        if self.every <= 0:
            raise At(("every",), "expected a duration > 0")
        if not self.path.strip():
            raise At(("path",), "expected a glob like ckpt/step_*.pt")
        why = refusal(self.path)
        if why:
            raise At(("path",), f"{describe(self.path)} refused: {why}")
        if self.settle <= 0:
            raise At(("settle",), "expected a duration > 0")
        if self.done_file is not None and (not self.done_file.strip() or "/" in self.done_file
                                           or self.done_file in (".", "..")
                                           or not self.done_file.isprintable()):
            raise At(("done_file",),
                     f"expected a file name like trainer_state.json, got {describe(self.done_file)}")
        return self


def check_checkpoint_use(spec) -> None:
    """The JobSpec-wide rules: ``{resume_from}`` only in resume_args and only with
    train.checkpoint; a relative glob checked again inside an absolute workdir."""
    for loc, command in [(("train", "command"), spec.train.command)] + \
            ([(("warmup", "command"), spec.warmup.command)] if spec.warmup else []):
        if any("{resume_from}" in text for text in ([command] if isinstance(command, str) else command)):
            raise At(loc, "{resume_from} is only for train.resume_args (the arguments of a resumed trainer)")
    for i, arg in enumerate(spec.train.resume_args):
        if "{resume_from}" in arg and spec.train.checkpoint is None:
            raise At(("train", "resume_args", i), "{resume_from} needs train.checkpoint (path and every): "
                     "gpujob fills it with the checkpoint this job wrote")
    check_scratch(spec)
    if spec.train.checkpoint is not None and spec.workdir and spec.workdir.startswith("/"):
        why = refusal(spec.train.checkpoint.path, spec.workdir)
        if why:
            raise At(("train", "checkpoint", "path"), f"{describe(spec.train.checkpoint.path)} in workdir "
                     f"{describe(spec.workdir)} refused: {why}")


def _overlap(a: str, b: str) -> bool:
    """Whether relative folder ``a`` is, holds, or lies inside ``b``."""
    a, b = a.strip("/"), b.strip("/")
    return a == b or a.startswith(b + "/") or b.startswith(a + "/")


def check_scratch(spec) -> None:
    """warmup.scratch is emptied before each warmup run: it must hold nothing the job
    ships (a sync dest) or keeps (the checkpoint glob's folder). A folder synced into the
    workdir itself (``dest: .``) is not checked: what it holds is known only at submit."""
    scratch = spec.warmup.scratch if spec.warmup else None
    if scratch is None:
        return
    for i, entry in enumerate(spec.sync):
        dest = (entry.dest or "").replace("{workdir}/", "")
        if dest not in ("", ".") and not dest.startswith("/") and _overlap(scratch, dest):
            raise At(("warmup", "scratch"), f"{describe(scratch)} overlaps sync[{i}].dest {describe(dest)}: "
                     "emptying it before each warmup would delete the code the job ships")
    ck = spec.train.checkpoint
    if ck is not None:
        path = ck.path.replace("{workdir}/", "")
        fixed = path.split("/")
        glob_at = next((i for i, p in enumerate(fixed) if any(c in p for c in "*?[{")), len(fixed))
        head = "/".join(fixed[:glob_at])  # the folders before the first pattern
        if not path.startswith("/") and (head + "/").startswith(scratch.rstrip("/") + "/"):
            raise At(("warmup", "scratch"), f"{describe(scratch)} holds train.checkpoint.path "
                     f"{describe(ck.path)}: emptying it before each warmup would delete the job's "
                     "checkpoints")
