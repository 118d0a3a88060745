"""The checkpoint register (stdlib only): which checkpoints each run of a job wrote.

One register in the agent's home, one file per job: ``<home>/checkpoints/<job_id>.json``
(it outlives the job's directory, so ``gc --keep-checkpoints`` still knows whose
files they are after ``gc --older-than`` removed the job). A checkpoint is one match
of ``train.checkpoint.path`` (a file, or a directory such as HF's ``checkpoint-N/``).

Format 1::

    {"format": 1, "job_id": ID, "name": JOB NAME,
     "runs": [{"run": 1, "profile": P, "started_at": T, "pattern": ABS GLOB,
               "before": {ABS PATH: SIG},            # what the glob matched at the run's start
               "before_count": N}],                  # (the first BEFORE_KEPT of them, and how many)
     "files": {ABS PATH: {"shown": PATH AS THE GLOB NAMES IT, "run": N (the run that last wrote it),
                          "runs": [N, ...], "profile": P, "first_seen": T, "changed": T,
                          "sig": SIG, "size": BYTES, "step": N|null, "finished": bool,
                          "finished_at": T|null, "gone": T|null,
                          "torn": T|null (the run ended, not cleanly, while it was written)}}}

SIG is [kind, count, total size, newest mtime_ns, inode] (agent/home/ckscan.py). A match
counts as written by a run when it was not there at the run's start and was touched
after the run began, or its SIG has changed since; a file an earlier job left and nobody
touched is never this job's, even when a link made during the run brings it under the
glob, and nothing whose directory resolves to a refused place (ckscan.refused) is.
A plain file renamed into place (another inode at the path than at the last look) is
finished once a look sees it unchanged, without waiting ``settle``: the file at the path is
whole, however often the trainer saves. A checkpoint is
finished when ``done_file`` exists in it and nothing in it has changed for ``settle``
seconds (a directory checkpoint, when done_file is set: with more than one rank the
others' files may land just after rank 0's done file, as SpecForge's do), else when its
SIG has not changed for ``settle`` seconds.

Writes are atomic (mkstemp in the same directory, fsync, rename, fsync of the
directory) and happen only when something the register keeps changes (a checkpoint
appears, is finished, or goes); a supervisor killed at any moment leaves the old
register or the new one, and the next one takes the watch over from it
(``CkWatch.resume``): a file whose SIG differs from the one written down is simply
a checkpoint that changed again and settles anew, from the new supervisor's first look
(not its mtime: a save the trainer died in looks still for as long as nobody looked), and
for a trainer that had ended before the takeover only its exit finishes or tears it.
"""

from __future__ import annotations

import glob
import os
import time

from gpujob.agent.base import ckpaths, fsio
from gpujob.agent.base.ckpaths import step_of
from gpujob.agent.home import ckscan

FORMAT = 1
DIR = "checkpoints"
POLL_EVERY = 0.5  # seconds between two looks (glob + stat) of a watched run
POLL_SAVING = 0.2  # ... while one of its checkpoints is being written (settle needs a close look)
LOOK_BUDGET = 50  # the next look comes no sooner than this many times the CPU the last one cost
BEFORE_KEPT = 2000  # of what the glob matched at a run's start, the register keeps this many (the rest:
                   # a match touched before the run is never this run's anyway, ckscan.pre_existing)
SLICE = 2000  # a look stats at most this many matches besides the new ones and the job's own
MAX_GAP = 10.0  # ... and no later than this (a save is seen within it on any tree)


# ---- the file --------------------------------------------------------------------

#: a register's size at most (its entries are bounded by the checkpoints kept; far more than that)
MAX_BYTES = 256 << 20


def path_of(home_root: str, job_id: str) -> str:
    return os.path.join(home_root, DIR, f"{job_id}.json")


def empty(job_id: str, name: str) -> dict:
    return {"format": FORMAT, "job_id": job_id, "name": name, "runs": [], "files": {}}


def load(home_root: str, job_id: str, name: str = "") -> dict:
    """The job's register ({} entries when it has none yet, or it cannot be read)."""
    from gpujob.agent.base import jsonl
    try:  # bounded as every reader of a file the job's dir holds (agent/base/jsonl.py)
        data = jsonl.loads(jsonl.read_bounded(path_of(home_root, job_id), MAX_BYTES))
    except (OSError, ValueError):
        return empty(job_id, name)
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        return empty(job_id, name)
    data.setdefault("runs", [])
    data.setdefault("files", {})
    return data


def save(home_root: str, data: dict) -> None:
    """Atomic and durable (fsio.write_json: a fresh temp file beside the register that a
    planted link cannot redirect, fsync, rename, fsync of the directory)."""
    target = path_of(home_root, data["job_id"])
    d = os.path.dirname(target)
    os.makedirs(d, mode=0o700, exist_ok=True)
    fsio.write_json(target, data, mode=0o600)
    for name in os.listdir(d):  # the temp file of a writer killed before its rename
        if ".json.tmp" in name or name.startswith(".reg-") and name.endswith(".tmp"):  # (.reg-: before 12-05)
            try:
                if os.lstat(os.path.join(d, name)).st_mtime < time.time() - 60:
                    os.unlink(os.path.join(d, name))
            except OSError:
                pass


def all_registers(home_root: str) -> list:
    """Every job's register in the home (gc reads them)."""
    d = os.path.join(home_root, DIR)
    out = []
    for name in sorted(os.listdir(d)) if os.path.isdir(d) else []:
        if name.endswith(".json") and not name.startswith("."):
            reg = load(home_root, name[:-5])
            if reg["runs"] or reg["files"]:
                out.append(reg)
    return out


# ---- what is on disk (agent/home/ckscan.py) ------------------------------------------

signature, matches, scan = ckscan.signature, ckscan.matches, ckscan.scan


def find(workdir: str, pattern: str) -> list:
    """Matching files, newest first: [(path, mtime)] (gpu_idle's newest save; anyone's)."""
    full = pattern if os.path.isabs(pattern) else os.path.join(workdir, pattern)
    out = []
    for path in glob.glob(full, recursive=True):
        try:
            out.append((path, os.stat(path).st_mtime))
        except OSError:
            pass
    return sorted(out, key=lambda x: x[1], reverse=True)


# ---- pure rules ----------------------------------------------------------------------

def is_finished(entry: dict, t: float, settle: float, done_file, done_exists: bool) -> bool:
    """A directory checkpoint with ``done_file`` set is finished when that file is in it
    and nothing in it has changed for ``settle`` seconds (the ranks write their own files
    with no barrier before rank 0's done file); any other one when it has not changed for
    ``settle`` seconds."""
    if done_file and entry["sig"][0] == "d" and not done_exists:
        return False
    return t - entry["changed"] >= settle


def newest(reg: dict, run: int | None = None, exists=os.path.lexists) -> dict | None:
    """The newest finished checkpoint the job wrote (``run``: that run wrote it last)
    that is still there, or None."""
    best = None
    for path, e in reg["files"].items():
        if not e.get("finished") or e.get("gone") or e.get("torn") or (run is not None
                                                                       and e.get("run") != run):
            continue
        if not exists(path):
            continue
        if best is None or (e["changed"], e.get("step") or -1) > (best[1]["changed"],
                                                                  best[1].get("step") or -1):
            best = (path, e)
    if best is None:
        return None
    return dict(best[1], path=best[0])


def point(entry: dict | None, t: float) -> dict:
    """A register entry as the resume point events and ``describe`` use: {file, age, step}."""
    if not entry:
        return {"file": None}
    return {"file": entry["path"], "age": round(max(0.0, t - entry["changed"]), 1), "step": entry.get("step"),
            "run": entry.get("run"), "profile": entry.get("profile")}


def foreign(reg: dict, before: dict) -> list:
    """What a run found at its start that this job never wrote: [(path, sig)]."""
    return sorted((p, s) for p, s in before.items() if p not in reg["files"])


# ---- the live watch of one run --------------------------------------------------------

class CkWatch:
    """Polled from the watch loop (``poll(t)``, cheap: one glob and a stat per match,
    a walk only of a directory not yet finished); keeps the register up to date and
    returns the checkpoint events of CONTRACT.md."""

    def __init__(self, home_root: str, reg: dict, run: int, pattern: str, workdir: str, shown_relative: bool,
                 settle: float, done_file, seen: dict):
        self.home_root, self.reg, self.run = home_root, reg, run
        self.pattern, self.workdir, self.shown_relative = pattern, workdir, shown_relative
        self.settle, self.done_file = float(settle), done_file
        self.seen = seen  # path -> the SIG last looked at
        self.last_poll = 0.0
        self.ended = False  # resumed after the trainer ended: only its exit decides what is whole
        self.min_gap = 0.0  # LOOK_BUDGET x what the last look cost
        self.just_finished: list = []  # entries finished by the last poll
        rec: dict = next((r for r in reg["runs"] if r["run"] == run), {})
        self.before = rec.get("before") or {}  # what the glob matched at the run's start
        self.started_at = float(rec.get("started_at") or 0.0)
        self.refused_dirs: dict = {}  # real directory -> why a checkpoint may not lie there (or None)
        self.refused_why: str | None = None  # why the glob's fixed part, resolved now, is refused (or None)
        self.lister = ckscan.Lister(pattern)
        self.new_paths: list = []  # matches the last listing brought that no look has seen yet
        self.looked: set = set()  # what the last look stat'ed
        self.turn = 0  # where the rotating slice of the other matches goes on

    @classmethod
    def begin(cls, home_root: str, job_id: str, name: str, profile: str, pattern: str, workdir: str,
              shown_relative: bool, settle: float, done_file, t: float) -> CkWatch:
        """A new run: what the glob matches now is written down (durably) before the
        trainer starts, so nothing already there is ever taken for this run's."""
        reg = load(home_root, job_id, name)
        before = scan(pattern)
        run = len(reg["runs"]) + 1
        kept = dict(sorted(before.items())[:BEFORE_KEPT])  # a huge tree is not copied into each write
        reg["runs"].append({"run": run, "profile": profile, "started_at": t, "pattern": pattern,
                            "before": kept, "before_count": len(before)})
        save(home_root, reg)
        w = cls(home_root, reg, run, pattern, workdir, shown_relative, settle, done_file, dict(before))
        w.before = before
        return w

    @classmethod
    def resume(cls, home_root: str, job_id: str, name: str, run: int, pattern: str, workdir: str,
               shown_relative: bool, settle: float, done_file, t: float = 0.0,
               ended: bool = False) -> CkWatch | None:
        """Take the watch of run ``run`` over from a supervisor that is gone, at ``t``. What
        changed while nobody watched settles from ``t`` on, not from its mtime (a save the
        trainer died in looks still for as long as nobody looked); ``ended``: the trainer
        had ended by then, so nothing it left unfinished settles: its exit decides (close)."""
        reg = load(home_root, job_id, name)
        rec = next((r for r in reg["runs"] if r["run"] == run), None)
        if rec is None:
            return None
        seen = dict(rec.get("before") or {})
        for path, e in reg["files"].items():
            if not e.get("gone"):
                seen[path] = e["sig"]
        w = cls(home_root, reg, run, pattern, workdir, shown_relative, settle, done_file, seen)
        w.last_poll, w.ended = t, ended
        return w

    def shown(self, path: str) -> str:
        return os.path.relpath(path, self.workdir) if self.shown_relative else path

    def poll(self, t: float, force: bool = False) -> list:
        """Events since the last look: [{t, ckpt, op, size}]. A look costs a glob and a
        stat per match; the next one comes no sooner than LOOK_BUDGET times what this
        one cost (a glob over a huge tree is looked at less often, never more than a
        few per cent of a core; MAX_GAP at most), unless ``force``."""
        self.just_finished = []
        every = max(POLL_SAVING if self._unfinished() else POLL_EVERY, self.min_gap)
        if not force and t - self.last_poll < every:
            return []
        began = time.thread_time()
        last, self.last_poll = self.last_poll, t
        events, dirty, moved = [], False, set()
        found = set()
        self.refused_why = ckscan.glob_refusal(self.pattern, self.home_root)
        for path in ([] if self.refused_why else self._candidates()):
            entry = self.reg["files"].get(path)
            sig = self._sig(path, entry)
            if sig is None:
                continue
            found.add(path)
            prev = self.seen.get(path)
            if prev == sig:
                continue
            self.seen[path] = sig
            if (entry is None or entry.get("gone")) and not self._may_register(path, sig, prev):
                continue
            moved.add(path)
            op = "new" if prev is None else "changed"
            if entry is None or entry.get("gone"):
                entry = {"shown": self.shown(path), "runs": [], "first_seen": t, "step": step_of(path),
                         "gone": None}
                self.reg["files"][path] = entry
                dirty = True
            if entry.get("run") != self.run:
                dirty = True
            # it changed after the last look: at its mtime, unless a clock says otherwise
            changed = max(last, min(t, sig[3] / 1e9))
            if entry.get("finished") or entry.get("began") is None or entry.get("run") != self.run:
                entry["began"] = changed  # a new save of it begins
            entry.update(run=self.run, profile=self._profile(), changed=changed, sig=sig, size=sig[2],
                         finished=False, finished_at=None, torn=None, real=ckscan.real_dir(path))
            if self.run not in entry["runs"]:
                entry["runs"].append(self.run)
            events.append({"t": t, "ckpt": entry["shown"], "op": op, "size": sig[2]})
            entry["replaced"] = ckscan.replaced(sig, prev)
            if ckscan.renamed_whole(path, sig):  # renamed into place: whole when it is there
                self._finish(path, entry, t)
                dirty = True
        listed = set() if self.refused_why else self.lister.set
        for path in [p for p in self.seen if p not in listed or (p in self.looked and p not in found)]:
            del self.seen[path]
            entry = self.reg["files"].get(path)
            if entry is not None and not entry.get("gone"):
                entry["gone"] = t
                dirty = True
            events.append({"t": t, "ckpt": entry["shown"] if entry else self.shown(path), "op": "gone",
                           "size": 0})
        for path, entry in self._unfinished():
            done = bool(self.done_file) and os.path.exists(os.path.join(path, self.done_file))
            # a file replaced by another inode (renamed into place) is whole once one look saw it unchanged
            settle = 0.0 if entry.get("replaced") else self.settle
            if path not in moved and not self.ended and is_finished(entry, t, settle, self.done_file, done):
                self._finish(path, entry, t)
                dirty = True
        if dirty:
            save(self.home_root, self.reg)
        self.min_gap = min(MAX_GAP, (time.thread_time() - began) * LOOK_BUDGET)
        return events

    def _candidates(self) -> list:
        """The matches this look stats: every new one, every one the register holds for
        this job, and a rotating slice of SLICE of the others (an earlier job's file this
        run rewrites in place is seen within a few looks); the listing itself is taken
        again only when the glob's directory changed (ckscan.Lister)."""
        listing = self.lister
        if listing.look():
            self.new_paths = [p for p in listing.paths if p not in self.seen]
        own = [p for p, e in self.reg["files"].items() if not e.get("gone") and p in listing.set]
        if len(listing.paths) <= SLICE:
            out = listing.paths
        else:
            self.turn = self.turn % len(listing.paths)
            out = listing.paths[self.turn:self.turn + SLICE]
            self.turn += SLICE
            out = sorted(set(out) | set(own) | set(self.new_paths))
        self.new_paths = []
        self.looked = set(out)
        return out

    def _finish(self, path: str, entry: dict, t: float) -> None:
        entry.update(finished=True, finished_at=t,
                     took=round(max(0.0, t - (entry.get("began") or entry["first_seen"])), 3))
        self.just_finished.append(dict(entry, path=path))

    def _may_register(self, path: str, sig, prev) -> bool:
        """A match the register does not hold yet: this run's only when it lies where a
        checkpoint may (its directory resolved through links) and the run wrote it
        (seen at the start and changed since, or touched after the run began)."""
        real = ckscan.real_dir(path)
        if real not in self.refused_dirs:
            self.refused_dirs[real] = ckscan.refused(real, self.home_root)
        if self.refused_dirs[real]:
            return False
        if prev is not None and self.before.get(path) is not None:
            return True  # there at the run's start, and it changed since: this run wrote it
        return not ckscan.pre_existing(path, sig, self.started_at)

    def _sig(self, path: str, entry):
        """A finished directory is looked at by its top entry only (a new file in it
        changes that); everything else is stat'ed or walked in full."""
        if entry is not None and entry.get("finished") and not entry.get("gone") and entry["sig"][0] == "d":
            try:
                top = os.lstat(path).st_mtime_ns
            except OSError:
                return None
            if top <= entry["sig"][3]:
                return entry["sig"]
        return signature(path)

    def _profile(self):
        return next((r["profile"] for r in self.reg["runs"] if r["run"] == self.run), None)

    def close(self, t: float, clean: bool) -> list:
        """The run ended. Its unfinished checkpoints are finished when it exited 0 or
        when a rename put them in place (another inode at the path: whole whenever it is
        there), else torn (marked so, never a resume point); returns the torn ones."""
        torn = []
        for path, e in self._unfinished():
            if clean or e.get("replaced"):
                e.update(finished=True, finished_at=t)
            else:
                e["torn"] = t
                torn.append(dict(e, path=path))
        if torn or clean:
            save(self.home_root, self.reg)
        return torn

    def _unfinished(self) -> list:
        return [(p, e) for p, e in self.reg["files"].items() if e.get("run") == self.run
                and not e.get("finished") and not e.get("gone") and not e.get("torn")]

    def finish_between_writes(self, paths: set, t: float, quiet: float) -> list:
        """A stop's (or rollback's) wait: the files among ``paths`` this run rewrites in place
        more often than ``settle`` (changing for longer than settle, never unchanged that
        long) and unchanged for ``quiet`` s now are whole between two writes: finished now
        (a later write makes them a save in progress again). Returns their entries."""
        self.just_finished = []
        for path, e in self._unfinished():
            began = e.get("began") or e["first_seen"]
            if (path in paths and e["sig"][0] == "f" and not self.done_file
                    and e["changed"] - began >= self.settle and t - e["changed"] >= quiet):
                self._finish(path, e, t)
        if self.just_finished:
            save(self.home_root, self.reg)
        return self.just_finished

    def saving(self) -> list:
        """This run's checkpoints not finished yet (a save in progress)."""
        return [dict(e, path=p) for p, e in self._unfinished()]

    def newest_own(self, t: float) -> dict:
        """The newest finished checkpoint of this run, as a resume point."""
        return point(newest(self.reg, self.run), t)


# ---- at submit -------------------------------------------------------------------------

def owners(home_root: str) -> dict:
    """{path: job id} of every checkpoint a register records (not gone)."""
    return {p: reg["job_id"] for reg in all_registers(home_root) for p, e in reg["files"].items()
            if not e.get("gone")}


#: how many of the checkpoints found at submit the answer lists (a glob over a tree of 100k
#: files must not become an answer past the controller's 8 MiB cap); ``left_count`` has all
LEFT_SHOWN = 20


def own_fixed_place(job: dict, workdir: str, patterns: list) -> str | None:
    """The job's one checkpoint place inside its own workdir, when its trainer resumes from a
    fixed place by itself (agent/base/ckpaths.py fixed_place) and every profile shares it:
    a trial's start is copied straight there (the supervisor's start_copy then has nothing
    to do). None otherwise: a glob, a place per profile, or one outside the workdir (a
    trial never writes outside its own)."""
    train = job["spec"].get("train") or {}
    ck = train.get("checkpoint") or {}
    if not ck or len(set(patterns)) != 1 or not ckpaths.fixed_place(ck["path"], train.get("resume_args")):
        return None
    dest = os.path.normpath(patterns[0])
    return dest if os.path.realpath(dest).startswith(os.path.realpath(workdir) + os.sep) else None


def at_submit(home_root: str, job: dict, workdir: str, patterns: list) -> dict:
    """What a fresh job finds under its checkpoint globs (``patterns``: absolute, one per
    profile): the checkpoints earlier jobs left, listed with their owner when a register
    knows it, and ``submit --resume-from PATH|JOB`` resolved into ``job["resume_from"]``
    (ValueError, one line, when it names nothing usable)."""
    own = owners(home_root)
    left = {}
    for pattern in patterns:
        for path in matches(pattern):
            left[path] = {"path": path, "job": own.get(path)}
    names = sorted(left)
    out = {"where": patterns[0] if len(set(patterns)) == 1 else ", ".join(sorted(set(patterns))),
           "left": [left[p] for p in names[:LEFT_SHOWN]], "left_count": len(names)}
    ask = job.pop("resume_from_ask", None)
    if ask is None:
        return out
    path = ask if os.path.isabs(ask) else os.path.join(workdir, ask)
    if os.path.lexists(path):
        entry = {"path": os.path.normpath(path), "job": own.get(os.path.normpath(path)),
                 "step": step_of(path)}
    elif "/" not in ask and os.path.exists(path_of(home_root, ask)):
        best = newest(load(home_root, ask))
        if best is None:
            raise ValueError(f"--resume-from {ask}: that job wrote no finished checkpoint that is still "
                             f"there (its register: {path_of(home_root, ask)})")
        entry = {"path": best["path"], "job": ask, "step": best.get("step")}
    else:
        raise ValueError(f"--resume-from {ask}: no such checkpoint ({path}) and no job of that id in "
                         f"{os.path.join(home_root, DIR)}")
    if job.pop("resume_from_copy", False):  # a trial (gpujob bisect/tune --from): never the job's own files
        from gpujob.agent.home.ckcopy import copy_start
        entry = copy_start(entry, home_root, workdir, dest=own_fixed_place(job, workdir, patterns))
    job["resume_from"] = entry
    out["resume_from"] = entry
    return out
