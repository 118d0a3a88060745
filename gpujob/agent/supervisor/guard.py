"""The supervisor's safeguards at the end of a job (stdlib only): the space held
back for writing the final state when the disk fills, and the boot hook of
``resume_after_reboot`` jobs. ``Guard`` is built with the job (``parts.Job``), the
journal, the report, the child env (the secrets it drops) and the runner (the phase
process it ends)."""

from __future__ import annotations

import os

from gpujob.agent.supervisor import boothook
from gpujob.agent.base.protocol import ENDED
from gpujob.agent.home.journal import Journal
from gpujob.agent.base.fsio import now
from gpujob.agent.base.protocol import JobState


class Guard:
    def __init__(self, job, journal, report, child_env, runner):
        self.job, self.journal, self.report = job, journal, report
        self.child_env, self.runner = child_env, runner

    def drop_boot_hook(self) -> None:
        """The job's boot hook goes when no other job of this home needs it."""
        if not (self.job.spec.get("resume_after_reboot") and self.job.job.get("boot_hook")):
            return
        for other in self.job.home.job_ids():
            j = Journal(self.job.home, other)
            if other != self.job.job_id and (j.job().get("spec") or {}).get("resume_after_reboot") and \
                    j.state().get("state") not in ENDED:
                return
        try:
            if boothook.remove(self.job.home.root):
                self.journal.event("boot_hook_removed", path=boothook.RC_LOCAL)
        except OSError as e:
            self.journal.event("warning",
                               message=f"could not remove the boot hook from {boothook.RC_LOCAL}: {e}")

    # ---- disk full ---------------------------------------------------------
    RESERVE = 256 * 1024

    def make_reserve(self) -> None:
        """A little space held back in the job's directory, freed when the disk is
        full so that the final state can still be written."""
        path = self.journal.path(".reserve")
        if os.path.exists(path):
            return
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
            try:
                os.posix_fallocate(fd, 0, self.RESERVE)
            finally:
                os.close(fd)
        except OSError:
            try:
                os.unlink(path)
            except OSError:
                pass

    def drop_reserve(self) -> None:
        try:
            os.unlink(self.journal.path(".reserve"))
        except OSError:
            pass

    def disk_full(self, e: OSError) -> None:
        where = os.path.dirname(e.filename) if getattr(e, "filename", None) else self.journal.dir
        code = None
        proc = self.runner.proc
        if proc is not None and proc.running():
            proc.kill(5)
        if proc is not None:
            code = proc.returncode
        self.drop_reserve()
        reason = f"no space left on device in {where}"
        # if it fits
        self.report.notifier.emit("failure", "end", reason=reason, signal="disk_full", exit_code=code)
        self.child_env.drop_secrets()
        self.journal.set_state(state=JobState.FAILED, phase="done", reason=reason, finished_at=now(),
                               child=None, exit_code=code, signal="disk_full")
        try:
            self.journal.event("state", state=JobState.FAILED, phase="done", reason=reason)
            self.report.say(f"job failed: {reason}")
        except OSError:
            pass

    def disk_is_full(self) -> bool:
        try:
            st = os.statvfs(self.journal.dir)
        except OSError:
            return False
        return st.f_bavail * st.f_frsize < 64 * 1024

