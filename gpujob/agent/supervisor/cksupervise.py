"""The supervisor's checkpoint side (stdlib only; ``Checkpoints``): each trainer
run's watch of ``train.checkpoint.path`` (agent/home/ckregister.py keeps the register),
where a resumed trainer starts from (only a checkpoint this job wrote, or the one
``submit --resume-from`` named), ``{resume_from}`` in ``resume_args`` (or, for a trainer
that resumes from a fixed place, the named checkpoint copied there: ``start_copy``), and a
stop or rollback that waits for a save in progress before it signals the trainer.
"""

from __future__ import annotations

import os

from gpujob.agent.home import ckcopy, ckregister
from gpujob.agent.judge import checkpoint
from gpujob.agent.base import ckpaths, defaults
from gpujob.agent.base.placeholders import substitute
from gpujob.agent.base.fsio import now
from gpujob.agent.base.proc import die_here
from gpujob.agent.base.protocol import OutcomeKind
from gpujob.agent.judge.outcome import EnvError

#: a file rewritten in place more often than its settle, unchanged this long while a stop
#: waits for it: between two writes (each write of such a trainer is a burst well under this)
QUIET = 1.0


class Checkpoints:
    """Built with the job (``parts.Job``), the journal, the runner (its relay and nap,
    while a save is waited for), the child env (the placeholder values), the report,
    and ``after_events``: the watch's pause side of the checkpoint events."""

    def __init__(self, job, journal, runner, child_env, report, after_events=None):
        self.job, self.journal, self.runner, self.child_env = job, journal, runner, child_env
        self.say, self.after_events = report.say, after_events
        self.copied: str | None = None  # where start_copy put submit --resume-from's checkpoint

    def checkpoint_cfg(self):
        """train.checkpoint with its defaults (settle, done_file, save_wait), or None."""
        return defaults.section(self.job.spec["train"], "checkpoint")

    def checkpoint_pattern(self, profile: str) -> tuple:
        """(absolute glob, whether the spec's glob is relative to the workdir)."""
        pattern = substitute(self.checkpoint_cfg()["path"], self.child_env.values(profile))
        rel = not os.path.isabs(pattern)
        return (os.path.join(self.job.workdir, pattern) if rel else pattern), rel

    def checkpoint_watch(self, profile: str, adopt: dict | None):
        """This trainer run's watch: a new run written into the register before the
        trainer starts, or (re-adoption) the run a previous supervisor began."""
        ck = self.checkpoint_cfg()
        if not ck:
            return None
        pattern, rel = self.checkpoint_pattern(profile)
        args = dict(workdir=self.job.workdir, shown_relative=rel, settle=ck["settle"],
                    done_file=ck.get("done_file"))
        name = self.job.spec.get("name", "")
        if adopt is not None and adopt.get("ck_run"):
            ended = bool(adopt.get("exit_file")) and os.path.exists(adopt["exit_file"])  # its keeper wrote it
            w = ckregister.CkWatch.resume(self.job.home.root, self.job.job_id, name, adopt["ck_run"], pattern,
                                          t=now(), ended=ended, **args)
            if w is not None:
                return w
        w = ckregister.CkWatch.begin(self.job.home.root, self.job.job_id, name, profile, pattern, t=now(),
                                     **args)
        left = [(p, s) for p, s in ckregister.foreign(w.reg, w.before) if p != self.copied]
        if left and w.run == 1:
            self.journal.event("checkpoints_left", count=len(left), files=[p for p, _ in left[:20]])
            why = self.job.job.get("self_loads")  # the trainer's own look (spec/selfload.py, at submit)
            self.say(f"{len(left)} checkpoint(s) under {ck['path']} were left by earlier jobs "
                     f"(e.g. {left[0][0]}): "
                     + (f"gpujob never passes them to this job, but {why}" if why else
                        "this job never resumes from them")
                     + (" (submit --resume-from chose one)" if self.job.job.get("resume_from") else ""))
        return w

    def poll_checkpoints(self, run, t: float, force: bool = False) -> None:
        """From the watch loop's periodic check (and the gate): ``run.ckwatch.poll`` (at
        most every ckregister.POLL_EVERY unless ``force``; [] in between), then
        ``on_ckpt_events``. Every poll goes through here, so no event is dropped."""
        if run.ckwatch is None:
            return
        events = run.ckwatch.poll(t, force=force)
        why = run.ckwatch.refused_why
        if why and why != run.ck_refused:
            run.ck_refused = why
            self.journal.event("checkpoint_glob_refused", why=why)
            self.say(f"train.checkpoint.path: {why}; nothing there is taken for this job's checkpoints")
        self.on_ckpt_events(run, events, t)

    def close_checkpoints(self, run, returncode) -> None:
        """The run ended: a last look, then what it left unfinished is finished (it
        exited 0: its writes are done) or torn (killed or crashed mid-save: never a
        resume point)."""
        if run.held is not None:  # the run ended while a rollback waited for its checkpoint
            self.journal.set_state(waiting=None)
        if run.ckwatch is None:
            return
        t = now()
        self.poll_checkpoints(run, t, force=True)
        for entry in run.ckwatch.close(t, clean=returncode == 0):
            self.journal.event("checkpoint_torn", ckpt=entry["shown"], run=run.ckwatch.run,
                               returncode=returncode)
            again = " (a new save into the same file had begun: the earlier one there is overwritten)" \
                if entry.get("took") is not None else ""
            self.say(f"checkpoint {entry['shown']} was being written when the trainer ended "
                     f"(exit {returncode}){again}: it will not be resumed from")

    def gate(self, run, outcome, t: float):  # called by the watch loop (watch.py)
        """rollback.wait_for_checkpoint: an automatic rollback of a running trainer waits
        until this run has written a finished checkpoint (at most checkpoint.hold_limit);
        anything else passes. A checkpoint this run did not write (an earlier job's
        ``out/ckpt.pt``, an earlier run's) never releases it."""
        ck = self.job.spec["train"].get("checkpoint")
        if not (ck and self.job.rb.get("wait_for_checkpoint") and run.phase == "train"):
            return outcome
        if outcome is None:
            if run.held is None:
                return None
            outcome = run.held
        elif outcome.kind != OutcomeKind.SIGNAL or outcome.signal_name not in (self.job.rb.get("on") or []):
            return outcome
        own = {"file": None}
        if run.ckwatch is not None:
            self.poll_checkpoints(run, t, force=run.held is None)  # the newest look before deciding
            own = run.ckwatch.newest_own(t)
            run.ck_seen = bool(own["file"])
        waited = t - run.held_at if run.held is not None else 0.0
        if run.ck_seen or waited > checkpoint.hold_limit(float(ck["every"])):
            if run.held is not None:
                why = "a checkpoint exists" if run.ck_seen else "no checkpoint came; rolling back anyway"
                self.journal.event("rollback_released", waited=round(waited, 2), why=why,
                                   **{k: own.get(k) for k in ("file", "age", "step")})
                self.say(f"rollback held {waited:.1f}s: {why}"
                         + (f" ({checkpoint.saved_by_run(own)})" if run.ck_seen else ""))
                outcome.evidence["held_for_checkpoint_s"] = round(waited, 2)
                self.journal.set_state(waiting=None)
                outcome.at = t  # the rollback's clock (took, timings) starts when it goes ahead
            return outcome
        if run.held is None:
            run.held, run.held_at, run.held_told = outcome, t, 0.0
            limit = checkpoint.hold_limit(float(ck["every"]))
            self.journal.event("rollback_held", signal=outcome.signal_name, reason=outcome.reason,
                               limit=limit)
            self.journal.set_state(waiting={"what": "rollback", "for": f"a finished checkpoint of this run "
                                            f"({ck['path']})", "since": t, "limit": limit,
                                            "reason": outcome.reason or outcome.signal_name})
            self.say(f"{outcome.signal_name}: rollback decided, held until this run writes a finished "
                     f"checkpoint ({ck['path']}), {limit:g}s at most; then it rolls back anyway")
        elif waited - run.held_told >= 30:  # every 30 s in job.log (logs -f follows it)
            run.held_told = waited
            self.say(f"rollback still held for a finished checkpoint ({ck['path']}): "
                     f"{checkpoint.hold_limit(float(ck['every'])) - waited:.0f}s left at most")
        return None

    def on_ckpt_events(self, run, events: list, t: float) -> None:
        """The register side of the checkpoint events: a checkpoint that appears or
        goes, and one that is finished, are journalled (a change while it is written is
        not: the register and the trace hold it)."""
        for e in events:
            if e["op"] in ("new", "gone"):
                self.journal.event("checkpoint", op=e["op"], ckpt=e["ckpt"], size=e["size"],
                                   run=run.ckwatch.run)
        for entry in run.ckwatch.just_finished:
            self.journal.event("checkpoint_finished", ckpt=entry["shown"], step=entry.get("step"),
                               size=entry.get("size"), run=run.ckwatch.run,
                               took=round(entry["finished_at"] - entry["first_seen"], 2))
        if self.after_events is not None:  # the pause side (the watch's)
            self.after_events(run, events, t)

    def save_limit(self, run) -> float:
        """How long a stop waits for a save in progress: train.checkpoint.save_wait, or
        less once this run has finished a save (twice the longest it took, plus settle:
        a rewrite in place that never settles holds a stop no longer than that)."""
        ck = self.checkpoint_cfg()
        limit, settle = float(ck["save_wait"]), float(ck["settle"])
        took = [e.get("took") or 0.0 for e in run.ckwatch.reg["files"].values()
                if e.get("run") == run.ckwatch.run and e.get("finished") and e.get("took") is not None]
        return min(limit, max(2 * max(took), settle) + settle) if took else limit

    def wait_for_save(self, run, proc, t: float) -> None:
        """A stop or rollback that finds this run's save in progress lets it finish
        (``save_limit`` at most) before the trainer is signalled, saying what it waits
        for and how long is left every few seconds. Only the saves in progress when it
        came are waited for: a trainer that saves all the time must not hold a stop each
        time. A save renamed into place is finished when seen: nothing to wait for."""
        if run.ckwatch is None or not proc.running():
            return
        self.poll_checkpoints(run, t, force=True)
        saving = run.ckwatch.saving()
        if not saving:
            return
        limit = self.save_limit(run)
        names = ", ".join(e["shown"] for e in saving[:3])
        waiting = {e["path"] for e in saving}
        self.journal.event("save_wait", checkpoints=[e["shown"] for e in saving], limit=limit)
        self.say(f"a checkpoint is being saved ({names}): waiting up to {limit:g}s for it to finish "
                 "before signalling the trainer")
        self.journal.set_state(waiting={"what": "stop", "for": f"the save of {names} to finish", "since": t,
                                        "limit": limit})
        told = t
        while proc.running() and now() - t < limit:
            self.runner.nap(proc, 0.2)
            for _ in self.runner.relay.drain():  # job.log keeps up meanwhile
                pass
            self.poll_checkpoints(run, now(), force=True)
            between = run.ckwatch.finish_between_writes(waiting, now(), QUIET)
            if between:  # rewritten in place more often than settle: it never settles
                die_here("between_writes")  # the suite's death point: finished in the register, not signalled
                self.on_ckpt_events(run, [], now())
                names = ", ".join(e["shown"] for e in between[:3])
                self.say(f"checkpoint {names} is rewritten in place more often than settle "
                         f"({run.ckwatch.settle:g}s): unchanged for {QUIET:g}s now, between two writes")
            if not [e for e in run.ckwatch.saving() if e["path"] in waiting]:
                break
            if now() - told >= 5.0:
                told = now()
                self.say(f"still waiting for the save of {names}: {limit - (told - t):.0f}s left")
        left = [e for e in run.ckwatch.saving() if e["path"] in waiting]
        waited = round(now() - t, 2)
        self.journal.set_state(waiting=None)
        self.journal.event("save_waited", waited=waited, finished=not left, left=[e["shown"] for e in left])
        self.say(f"checkpoint save finished after {waited:g}s: signalling the trainer" if not left else
                 f"checkpoint {', '.join(e['shown'] for e in left[:3])} still being written after "
                 f"{waited:g}s (at most {limit:g}s): signalling the trainer; that save will not be resumed "
                 f"from")

    def resume_choice(self, profile: str):
        """Where a resumed trainer starts: the newest finished checkpoint this job wrote,
        else the one ``submit --resume-from`` named; None when train.checkpoint is unset
        (gpujob cannot tell, resume_args go as they are); {"file": None} for none."""
        ck = self.checkpoint_cfg()
        if not ck:
            return None
        t = now()
        reg = ckregister.load(self.job.home.root, self.job.job_id)
        point = ckregister.point(ckregister.newest(reg), t)
        given = self.job.job.get("resume_from")
        if point["file"] is None and given and os.path.lexists(given["path"]):
            point = {"file": given["path"], "age": round(max(0.0, t - os.lstat(given["path"]).st_mtime), 1),
                     "step": given.get("step"), "from_job": given.get("job")}
            if given.get("copied_from"):  # a trial's start, copied at submit (agent/home/ckcopy.py)
                point.update(copied_from=given["copied_from"], shown=os.path.relpath(given["path"],
                                                                                     self.job.workdir))
        return point

    def fixed_place(self, profile: str) -> str | None:
        """This job's one checkpoint place (absolute) when its trainer resumes from there by
        itself (agent/base/ckpaths.py ``fixed_place``), else None."""
        ck = self.checkpoint_cfg()
        if not ck or not ckpaths.fixed_place(ck["path"], self.job.spec["train"].get("resume_args")):
            return None
        return self.checkpoint_pattern(profile)[0]

    def start_copy(self, profile: str, point: dict) -> dict:
        """``submit --resume-from``'s checkpoint for a trainer that resumes from a fixed place:
        copied into this job's place before the trainer starts (beside it, then renamed in:
        a supervisor killed mid-copy leaves nothing half-copied there, and the revived one
        copies again). Done before the run's checkpoint watch begins, so the copy is in what
        the run found at its start: never counted as written by this job until the trainer
        rewrites it. The point, with ``file`` the copy and ``copied_from`` its source."""
        dest = self.fixed_place(profile)
        src = point["file"]
        if dest is None or os.path.realpath(src) == os.path.realpath(dest):
            return point
        shown = os.path.relpath(dest, self.job.workdir) if self.checkpoint_pattern(profile)[1] else dest
        self.journal.event("start_copy", src=src, dest=dest, job=point.get("from_job"))
        self.say(f"copying {src} into this job's {shown} before the trainer starts (submit --resume-from; "
                 "its resume_args load from there)")
        self.journal.set_state(waiting={"what": "the trainer's start", "since": now(),
                                        "for": f"the copy of {src} into {shown}"})
        try:  # its own job may still rewrite it in place: a copy it changed under is made again
            settle = float(self.checkpoint_cfg()["settle"])
            made = ckcopy.copy_steady(src, dest, self.job.workdir, wait=settle)
        except (OSError, ValueError) as e:
            raise EnvError(f"submit --resume-from: copying {src} to this job's checkpoint place {dest} "
                           f"failed: {e}") from None
        finally:
            self.journal.set_state(waiting=None)
        self.copied = dest
        self.journal.event("start_copied", src=src, dest=dest, job=point.get("from_job"), copies=made)
        return dict(point, file=dest, copied_from=src, shown=shown)

    def resume_args(self, profile: str, resume: bool) -> tuple:
        """(the arguments added to the trainer's argv, the resume point or None)."""
        spec_args = list(self.job.spec["train"].get("resume_args") or [])
        if not resume:
            return [], None
        point = self.resume_choice(profile)
        if point is None:
            return spec_args, None
        note = checkpoint.describe(point)
        if point["file"] is None:
            note = "no checkpoint of this job: restarted from scratch, without resume_args"
            spec_args = []
        elif point.get("from_job") is not None or \
                self.job.job.get("resume_from", {}).get("path") == point["file"]:
            point = self.start_copy(profile, point)
            note = checkpoint.describe(point)
            note += f" (submit --resume-from{' ' + point['from_job'] if point.get('from_job') else ''})"
            if point.get("copied_from"):
                note += f": copied from {point['copied_from']} to this job's {point['shown']}"
        self.journal.event("resume_point", note=note, **point)
        self.journal.set_state(resumed=note)
        self.say(note)
        return ([substitute(a, {"resume_from": point["file"] or ""}) for a in spec_args],
                dict(point, note=note))
