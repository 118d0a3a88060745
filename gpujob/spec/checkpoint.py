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
    if spec.train.checkpoint is not None and spec.workdir and spec.workdir.startswith("/"):
        why = refusal(spec.train.checkpoint.path, spec.workdir)
        if why:
            raise At(("train", "checkpoint", "path"), f"{describe(spec.train.checkpoint.path)} in workdir "
                     f"{describe(spec.workdir)} refused: {why}")
