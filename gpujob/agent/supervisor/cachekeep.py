"""The supervisor's role that keeps a known-good profile's compile cache (stdlib
only): ``Caches``, built with the job (``parts.Job``), the journal, the ledger, the
envs (``install.Envs``: the env and cache keys) and the report.

- ``mark_good``: a profile becomes known-good → the ledger says how it was proven
  (``proof``: ``cold`` when its cache was empty when it started, else ``warm``) and
  its live cache is snapshotted (``snapshots.take``). ``snapshot_due`` goes to
  state first: a supervisor that dies meanwhile is followed by one that takes it.
- ``cache_step``: the ``restore`` step between ``env`` and ``warmup``. A known-good
  profile whose live cache is empty is restored from its newest snapshot, unless
  the submit asked to start cold; the retry below restores over a failed cold cache.
  Either way the step records how the cache started (``cache_start``).
- ``cold_retry``: a profile whose cold start failed with an error signature, while
  a snapshot of it exists, gets one retry on the restored cache before it is judged.
"""

from __future__ import annotations

from gpujob.agent.base.stages import Stage
from gpujob.agent.home import snapshots
from gpujob.agent.base import defaults, envs
from gpujob.agent.base.fsio import now
from gpujob.agent.base.proc import die_here
from gpujob.agent.base.protocol import FailureSignal, OutcomeKind


class Caches:
    """A known-good profile's cache snapshots, the restore step, the cold retry."""

    def __init__(self, job, journal, ledger, envs, report):
        self.job, self.journal, self.ledger, self.envs = job, journal, ledger, envs
        self.env_key, self.cache_key, self.say = envs.env_key, envs.cache_key, report.say

    def snapshots_keep(self) -> int:
        return int(defaults.section(self.job.spec, "caches")["snapshots_keep"])

    def usable_snapshot(self, profile: str):
        """The newest snapshot of this profile's cache made from the same venv."""
        for meta in snapshots.listing(self.job.home.root, self.cache_key(profile)):
            if meta.get("env_key") == self.env_key(profile):
                return meta
        return None

    # ---- known-good -> snapshot --------------------------------------------
    def mark_good(self, profile: str, **data) -> None:
        st = self.journal.state()
        start = st.get("cache_start") or {}
        before = self.ledger.read()["profiles"].get(profile) or {}
        proof = snapshots.proof_of(start.get("kind") if start.get("profile") == profile else None,
                                   before, self.env_key(profile))
        if self.snapshots_keep() > 0:
            self.journal.set_state(snapshot_due=profile)
        self.ledger.mark(profile, "good", job=self.job.job_id, env_key=self.env_key(profile), proof=proof,
                         cache_start=start.get("kind") if start.get("profile") == profile else None,
                         **data)
        die_here("known_good_marked")  # the ledger says good, the snapshot not yet taken
        if proof == "warm":
            self.journal.event("warning", message=f"profile {profile} is known-good on a warm cache only: "
                                                  "its cold start was never seen to work")
        self.take_snapshot(profile)

    def ensure_snapshot(self, profile: str) -> None:
        """A job on a profile that was known-good already (before snapshots existed, or
        after `cache clear --snapshots`) succeeded: its cache is proven too, snapshot it
        when there is no snapshot of it."""
        if self.snapshots_keep() > 0 and self.ledger.status(profile) == "good" and \
                self.usable_snapshot(profile) is None:
            self.journal.set_state(snapshot_due=profile)
            self.take_snapshot(profile)

    def take_snapshot(self, profile: str) -> None:
        """Take the snapshot written down in ``snapshot_due`` (again, after a death). A
        death before the ledger said good leaves it to ``mark_good``, which comes again
        (the job's end, or the re-adopted trainer's known-good verdict)."""
        if self.snapshots_keep() <= 0 or self.ledger.status(profile) != "good":
            self.journal.set_state(snapshot_due=None)
            return
        key = self.cache_key(profile)
        try:
            meta = snapshots.take(self.job.home.root, key, keep=self.snapshots_keep(), profile=profile,
                                  env_key=self.env_key(profile), job=self.job.job_id)
        except OSError as e:  # a full disk: no snapshot (nothing half made), the job goes on
            self.journal.event("warning", message=f"cache snapshot of {profile} failed: {e}")
            self.say(f"warning: cache snapshot of {profile} failed ({e}); the job goes on without one")
            self.journal.set_state(snapshot_due=None)
            return
        self.ledger.note(profile, snapshot={k: meta[k] for k in ("name", "at", "files", "bytes", "linked",
                                                                  "env_key", "key", "seconds")})
        self.journal.event("cache_snapshot", profile=profile, **{k: meta[k] for k in (
            "name", "files", "bytes", "linked", "seconds", "env_key")})
        self.say(f"cache: {snapshots.describe(meta)} taken of known-good profile {profile} "
                 f"in {meta['seconds']:.2f}s ({meta['linked']} hard links)")
        self.journal.set_state(snapshot_due=None)

    # ---- the restore step ----------------------------------------------------
    def cache_step(self, profile: str, cold: bool, **then) -> None:
        """The restore step (``then``: the state after it, written with its cache_start)."""
        st = self.journal.state()
        key = self.cache_key(profile)
        for what in snapshots.recover(self.job.home.root, key):
            self.journal.event("cache_recovered", profile=profile, did=what)
        retry = st.get("cold_retry") or {}
        snap = self.usable_snapshot(profile)
        live = snapshots.cache_files(self.job.home.root, key)  # compile files (the warm marker aside)
        empty = envs.tree_stats(envs.cache_dir(self.job.home.root, key))["files"] == 0  # cleared
        why: str | None
        if retry.get("profile") == profile and not retry.get("restored"):
            why = f"one retry on the restored cache after a cold start failed: {retry.get('reason')}"
        else:
            why = snapshots.restore_due(cold_start=cold, known_good=self.ledger.status(profile) == "good",
                                        live_empty=empty, snapshot=snap)
        kind = "cold" if live == 0 else "warm"
        meta = None
        if why and snap is not None:
            self.journal.sync()  # a durable state before the restore
            try:
                meta = snapshots.restore(self.job.home.root, key, snap)
            except OSError as e:  # the old cache stays: restore removed its temp dir, swap undid itself
                self.journal.event("warning", message=f"cache restore of {profile} failed: {e}")
                self.say(f"warning: restoring {snapshots.describe(snap)} failed ({e}); starting without it")
        if meta is not None:
            kind = "restored"
            self.journal.event("cache_restored", profile=profile, snapshot=meta["name"], files=meta["files"],
                               bytes=meta["bytes"], seconds=meta["restore_seconds"], why=why)
            self.say(f"cache: restored {snapshots.describe(meta)} for profile {profile} "
                     f"in {meta['restore_seconds']:.2f}s ({why})")
            if retry.get("profile") == profile:
                self.journal.set_state(cold_retry=dict(retry, restored=now()))
        elif cold and snap is not None:
            self.say(f"cache: starting cold as asked; {snapshots.describe(snap)} is kept, not restored")
        # deferred to the spawn's durable write (the restore above was preceded by a durable one;
        # a death before the spawn redoes this step)
        self.journal.set_state(cache_start={"profile": profile, "kind": kind}, durable=None, **then)
        self.journal.event("cache_start", profile=profile, start=kind,
                           files=live if kind != "restored" else None)

    # ---- a failed cold start: one retry on the snapshot ---------------------
    def cold_retry(self, out, profile: str) -> bool:
        """True when the failure ``out`` is retried once on the restored cache."""
        st = self.journal.state()
        start = st.get("cache_start") or {}
        if out.kind != OutcomeKind.SIGNAL or \
                out.signal_name not in (FailureSignal.ERROR_SIGNATURE, FailureSignal.COMPILE_RACE) or \
                st.get("cold_retry"):
            return False
        if start.get("profile") != profile or start.get("kind") != "cold":
            return False
        snap = self.usable_snapshot(profile)
        if snap is None:
            return False
        rec = {"profile": profile, "reason": out.reason, "at": now(), "snapshot": snap["name"]}
        self.journal.event("cold_retry", **rec)
        self.say(f"cold start of {profile} failed ({out.reason}); a {snapshots.describe(snap)} exists: "
                 f"one retry on it before judging {profile}")
        self.journal.set_state(cold_retry=rec, step=Stage.RESTORE, warmup_done=[], cache_cold=False,
                               resume=bool(st.get("resume")) or st.get("phase") == "train")
        return True
