"""``gpujob bisect`` and ``gpujob tune``: trials that touch nothing of the job's.

A trial is an ordinary gpujob job of its own: the spec with one profile (the good set
plus a subset of the bad set's changes, or a candidate of ``tune``), under the name
``<name>-bisect``. So the supervisor builds its venv with the same cache as every
profile (a set built before, the job's own profiles included, costs no install: the
venv key is the profile's content), runs the warmup and the trainer as a job would,
and journals the samples the judge parses. What keeps the job's things untouched:

- another name: its own workdir (``<home>/work/<name>-bisect``; the spec's ``workdir``
  is not used, a sync to an absolute place is refused), its own checkpoints and output
  dir in that workdir, its own ledger (the job's known-good is never read or changed
  by a trial), rollbacks off, no webhooks, no metrics file, no boot hook;
- the container's lock: a trial is refused while any job runs there (never two trainers
  on the same GPUs), so a running job is never touched either;
- each trial starts from the same point: from scratch (a fresh first run: no resume
  arguments), or with ``--from JOB`` resumed from a copy of that job's newest finished
  checkpoint, made in the trial's workdir at submit (agent/home/ckcopy.py), never the
  job's own file.

The laptop reads the trial's ``samples.jsonl`` as it runs, judges its steady rate with
``judge.bisect.steady`` and stops it once the rate is known well enough (``enough``) or
``trial_time`` seconds of training passed. ``gpujob gc`` removes the trial venvs as any
other unused venv (none is known-good in a ledger).
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass, field
from typing import Callable, Optional

from gpujob.agent.base import wire
from gpujob.agent.base import defaults
from gpujob.agent.base.fsio import json_objects
from gpujob.agent.base.protocol import JobState
from gpujob.agent.judge.policy import PolicyConfig
from gpujob.errors import InputError
from gpujob.agent.judge import bisect as core

SUFFIX = "-bisect"
FINAL = {JobState.SUCCEEDED, JobState.FAILED, JobState.STOPPED, JobState.LOST, JobState.NOT_FOUND}
PHASE_WORD = {"start": "starting", "env": "building", "warmup": "warming", "train": "measuring",
              "hold": "starting", "done": "done"}


def trial_name(name: str) -> str:
    return f"{name[:40 - len(SUFFIX)]}{SUFFIX}"


def check_scratch(spec) -> None:
    """A trial writes only under its own workdir: a sync to an absolute place is refused."""
    for i, s in enumerate(spec.sync):
        if s.dest and (s.dest.startswith("/") or s.dest.startswith("~")):
            raise InputError(f"{spec.source_path}: sync[{i}].dest: {s.dest[:80]!r} is outside the workdir; a "
                             "trial would write there (bisect and tune need every sync dest relative)")


def profile_of(spec, name: str):
    return spec.profile_by_name(name)


def set_name(res: dict) -> str:
    """An intermediate set's profile name, from its content: the same set has the same
    name, so the same venv key (built once)."""
    data = json.dumps({"p": core.pins(res), "e": res["env"]}, sort_keys=True)
    return "t-" + hashlib.sha256(data.encode()).hexdigest()[:10]


def trial_profile(good, bad, res: dict, name: str):
    """The good profile with the set ``res``: the bad profile's index first, the good
    one's as an extra index, both profiles' find_links."""
    index = bad.index_url or good.index_url
    extras = [u for u in [good.index_url, *good.extra_index_urls, *bad.extra_index_urls] if u and u != index]
    return good.model_copy(update={
        "name": name, "packages": core.pins(res), "env": dict(res["env"]), "index_url": index,
        "extra_index_urls": list(dict.fromkeys(extras)),
        "find_links": list(dict.fromkeys([*good.find_links, *bad.find_links]))})


YEAR = 365 * 86400.0


def trial_spec(spec, profile, trial_time: float = 600.0):
    """The job's spec for one trial (see the module doc for what changes and why). Its
    training ends on its own ``trial_time`` plus a quarter (at least 5 s) after it starts,
    so a trial whose laptop died frees the container soon; its ledger never calls a
    trial's set known-good (``good_after`` a year), so ``gpujob gc`` may remove its venv."""
    check_scratch(spec)
    tp = spec.throughput.model_copy(update={"good_after": YEAR}) if spec.throughput else None
    return spec.model_copy(update={
        "throughput": tp, "train": spec.train.model_copy(update={
            "timeout": trial_time + max(5.0, trial_time / 4), "restarts": None, "standby": None}),
        "name": trial_name(spec.name), "workdir": None, "profiles": [profile], "profile": profile.name,
        "rollback": spec.rollback.model_copy(update={"enabled": False, "fallback": []}),
        "caches": spec.caches.model_copy(update={"clear_on_submit": False}),
        "resume_after_reboot": False, "notify": [], "metrics": None})


def policy_of(spec) -> PolicyConfig:
    tp = defaults.section(spec.to_agent_dict(), "throughput")
    if tp is None:
        raise InputError(f"{spec.source_path}: throughput: missing; bisect and tune judge the trainer's "
                         "throughput, so the spec needs a throughput section (format, window)")
    return PolicyConfig.from_spec(tp)


@dataclass
class Trial:
    """One trial: what ran and what it measured."""

    label: str
    profile: str
    job_id: str = ""
    steady: Optional[core.Steady] = None
    verdict: str = ""
    ratio: Optional[float] = None
    state: str = ""
    seconds: float = 0.0
    reason: str = ""
    samples: list = field(default_factory=list)

    def view(self) -> dict:
        st = self.steady
        return {"label": self.label, "profile": self.profile, "job_id": self.job_id, "verdict": self.verdict,
                "ratio": self.ratio, "state": self.state, "seconds": round(self.seconds, 1),
                "reason": self.reason, "median": st.median if st else None,
                "spread": st.spread if st else None, "samples": st.n if st else len(self.samples)}


class Trials:
    """Runs trials one after another on one target (``t``: a gpujob Target)."""

    def __init__(self, t, cfg: PolicyConfig, *, trial_time: float, slower: float,
                 progress: Callable[[Trial, str], None], submit: Callable, poll: float = 1.0):
        self.t, self.cfg, self.trial_time, self.slower = t, cfg, trial_time, slower
        self.progress, self.submit, self.poll = progress, submit, poll
        self.good: Optional[core.Steady] = None

    def run(self, spec, label: str) -> Trial:
        """Submit the trial (``spec`` from :func:`trial_spec`), follow its samples, stop it
        once measured, judge it against ``self.good`` (when known)."""
        tr = Trial(label, spec.profile)
        t0 = time.monotonic()
        self.progress(tr, "submitting")
        tr.job_id = self.submit(spec)
        try:
            self.follow(tr)
        except KeyboardInterrupt:  # Ctrl-C: the trial ends with the command (its own timeout otherwise)
            self.t.ask(wire.StopAnswer, "stop", tr.job_id, timeout=600)
            raise
        tr.seconds = time.monotonic() - t0
        if not tr.samples and self.env_failed(tr):
            tr.verdict = core.UNRESOLVED
        elif self.good is not None:
            tr.verdict, tr.ratio = core.verdict(tr.steady, self.good, self.slower)
        else:
            tr.verdict = "measured" if tr.steady else "unclear"
        self.progress(tr, "done")
        return tr

    def follow(self, tr: Trial) -> None:
        offset, first_train = 0, None
        buf = bytearray()
        while True:
            st = self.status(tr.job_id)
            tr.state = st.get("state") or ""
            offset = self.read(tr.job_id, offset, buf)
            tr.samples = [(r["t"], r["value"]) for r in json_objects(bytes(buf))
                          if r.get("type") == "sample" and isinstance(r.get("value"), (int, float))]
            if tr.samples and first_train is None:
                first_train = time.monotonic()
            tr.steady = core.steady(tr.samples, self.cfg)
            if st.get("phase") != "done":
                self.progress(tr, PHASE_WORD.get(st.get("phase") or "", st.get("phase") or tr.state))
            if tr.state in FINAL:
                tr.reason = st.get("reason") or st.get("error") or ""
                break
            if first_train is not None and (time.monotonic() - first_train > self.trial_time
                                            or core.enough(tr.steady, self.slower)):
                self.progress(tr, "stopping")
                self.t.ask(wire.StopAnswer, "stop", tr.job_id, timeout=600)
                continue
            time.sleep(self.poll)

    def status(self, job_id: str) -> dict:
        jobs_ = self.t.ask(wire.StatusAnswer, "status", "--no-revive", "--missing-ok", job_id,
                           timeout=60).jobs
        return jobs_[0] if jobs_ else {"state": JobState.NOT_FOUND}

    def read(self, job_id: str, offset: int, buf: bytearray) -> int:
        from gpujob.ops.follow import follow_log
        return follow_log(self.t, job_id, file="samples.jsonl", follow=False, offset=offset,
                               write=buf.extend, notice=lambda m: None)

    @staticmethod
    def env_failed(tr: Trial) -> bool:
        """The trial's venv did not build (its set does not resolve)."""
        return tr.state == JobState.FAILED and ("installing profile" in tr.reason or "pins" in tr.reason
                                                or "verifying profile" in tr.reason)


@dataclass
class BisectResult:
    groups: list
    good: Trial
    trials: list
    answer: core.Answer
    culprit_trial: Optional[Trial]
    seconds: float

    def sentence(self) -> str:
        """``slow with: triton 3.5.1 -> 3.6.0 (moves with torch ...); 0.63x of good; 6 trials, 11 min``."""
        n = len(self.trials) + 1
        took = f"{n} trials, {self.seconds / 60:.0f} min" if self.seconds >= 60 else \
            f"{n} trials, {self.seconds:.0f} s"
        if not self.answer.culprit:
            return f"not slow here: no subset of the {len(self.groups)} changes was slower than good; {took}"
        groups = core.culprit_groups(self.groups, self.answer)
        ratio = self.culprit_trial.ratio if self.culprit_trial else None
        rate = f"{ratio:.2f}x of good" if ratio is not None else "rate unknown"
        return f"slow with: {core.describe(groups)}; {rate}; {took}"


def bisect(spec, good_name: str, bad_name: str, trials: Trials, holds: Optional[dict] = None,
           together=()) -> BisectResult:
    """Measure the good profile, then search the difference (judge.bisect.search)."""
    t0 = time.monotonic()
    good, bad = profile_of(spec, good_name), profile_of(spec, bad_name)
    g = core.resolved(good.model_dump(), (holds or {}).get(good_name))
    b = core.resolved(bad.model_dump(), (holds or {}).get(bad_name))
    groups = core.difference(g, b, together)
    if not groups:
        raise InputError(f"profiles {good_name} and {bad_name} hold the same packages and env: nothing to "
                         f"bisect")
    first = trials.run(trial_spec(spec, good, trials.trial_time), f"good ({good_name})")
    if first.steady is None:
        raise InputError(f"the good profile {good_name} gave no steady rate in its trial ({first.state}"
                         f"{': ' + first.reason if first.reason else ''}); a longer --trial-time may help")
    trials.good = first.steady
    first.verdict, first.ratio = core.OK, 1.0
    done: list = []
    by_set: dict = {}
    gen = core.search(len(groups))
    try:
        subset = next(gen)
        while True:
            chosen = [groups[i] for i in sorted(subset)]
            whole = len(subset) == len(groups)
            prof = bad if whole else trial_profile(good, bad, core.apply(g, chosen),
                                                   set_name(core.apply(g, chosen)))
            label = f"bad ({bad_name})" if whole else core.describe(chosen)
            tr = trials.run(trial_spec(spec, prof, trials.trial_time), label)
            done.append(tr)
            by_set[subset] = tr
            subset = gen.send(tr.verdict)
    except StopIteration as stop:
        answer = stop.value
    return BisectResult(groups, first, done, answer, by_set.get(frozenset(answer.culprit)),
                        time.monotonic() - t0)


def tune(spec, names: list, trials: Trials) -> list:
    """Each profile's trial from the same start; ``judge.bisect.rank`` of their steady rates."""
    got = {}
    runs = {}
    for name in names:
        tr = trials.run(trial_spec(spec, profile_of(spec, name), trials.trial_time), name)
        got[name], runs[name] = tr.steady, tr
    return [(name, st, margin, runs[name]) for name, st, margin in core.rank(got)]
