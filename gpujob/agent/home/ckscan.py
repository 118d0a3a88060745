"""What is on disk under a checkpoint glob (stdlib only): the register's looks
(agent/home/ckregister.py) and gc's checks before it deletes (agent/verbs/prune.py).

SIG is [kind, count, total size, newest mtime_ns, inode] (kind "f" or "d"; a register
written before the inode was kept holds four items, and any SIG compares unequal to it
once). A look costs one glob and one lstat per match; a directory is walked only while
it is not finished (``CkWatch._sig``), and the walk counts each entry once.

Which matches a job may ever call its own:
- the glob's fixed part is resolved through links (``real_dir``): a link made by the
  job's command after the submit (``ln -sfn /data/run ckpt``) is judged where it
  leads, with the refusals of agent/base/ckpaths.py (a system directory, gpujob's
  home) applied to the resolved path (``refused``);
- a match that was last touched before the run began (``pre_existing``: its mtime and
  ctime, the newest mtime inside a directory, older than the run's start) was not
  written by this run, whether the glob saw it at the start or a link brought it in
  later;
- gc deletes a registered path only while it is still the object written down
  (``same_object``: the inode and the newest mtime match, and its directory resolves
  to the one it was registered in).
"""

from __future__ import annotations

import glob
import os
import time

from gpujob.agent.base import ckpaths

#: a file counts as older than the run when touched this long before its start (s):
#: file systems stamp times from a coarse clock that can lag time.time() a little
PRE_RUN_SLACK = 0.5


def signature(path: str):
    """SIG of a checkpoint, or None when gone. A directory is walked (its files only;
    links are not followed)."""
    try:
        st = os.lstat(path)
    except OSError:
        return None
    if not os.path.isdir(path) or os.path.islink(path):
        return ["f", 1, st.st_size, st.st_mtime_ns, st.st_ino]
    count, size, newest = 0, 0, st.st_mtime_ns
    for root, dirs, files in os.walk(path):
        for name in dirs:
            try:
                newest = max(newest, os.lstat(os.path.join(root, name)).st_mtime_ns)
            except OSError:
                continue
        for name in files:
            try:
                s = os.lstat(os.path.join(root, name))
            except OSError:
                continue
            newest = max(newest, s.st_mtime_ns)
            count += 1
            size += s.st_size
    return ["d", count, size, newest, st.st_ino]


def replaced(sig, prev) -> bool:
    """A plain file at the path with another inode than at the last look: put there by
    a rename (write a temp file, then ``os.replace``) or made anew. A rewrite in place
    keeps the inode."""
    return bool(sig and prev and sig[0] == "f" and len(sig) >= 5 and len(prev) >= 5 and prev[4] != sig[4])


def renamed_whole(path: str, sig) -> bool:
    """A plain file whose status changed after its last write (a rename sets ctime,
    never mtime; a write in place sets both): whole when seen. File systems that stamp
    both from one coarse clock tick often tie them, and then ``replaced`` decides."""
    if sig is None or sig[0] != "f" or len(sig) < 5:
        return False
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return st.st_ino == sig[4] and st.st_ctime_ns > st.st_mtime_ns


def pre_existing(path: str, sig, started_at: float) -> bool:
    """Last touched before the run began (and not a thing the run renamed or copied
    into place: that sets its ctime)."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    cut = (started_at - PRE_RUN_SLACK) * 1e9
    return max(st.st_mtime_ns, st.st_ctime_ns, sig[3]) < cut


def matches(pattern: str) -> list:
    return sorted(glob.glob(pattern, recursive=True))


def scan(pattern: str) -> dict:
    out = {}
    for p in matches(pattern):
        sig = signature(p)
        if sig is not None:
            out[p] = sig
    return out


def real_dir(path: str) -> str:
    """The directory ``path`` lies in, resolved through every link."""
    return os.path.realpath(os.path.dirname(path))


def refused(real: str, home: str | None) -> str | None:
    """Why a match whose directory resolves to ``real`` may not be a checkpoint."""
    return ckpaths.refusal(os.path.join(real, "x"), home=home)


def glob_refusal(pattern: str, home: str | None) -> str | None:
    """The refusal of the glob's fixed part as it resolves now (through links), or None."""
    fixed = ckpaths.fixed_part(pattern)
    real = os.path.realpath(fixed)
    if real == os.path.normpath(fixed):
        return None  # no link on the way: the submit's check holds
    why = ckpaths.refusal(os.path.join(real, "*"), home=home)
    return f"{fixed} leads to {real}: {why}" if why else None


def same_object(path: str, entry: dict) -> str | None:
    """Still the object the register wrote down? None when it is, else why not
    (gc deletes only what still matches)."""
    sig = entry.get("sig") or []
    real = entry.get("real")
    if real is not None and real_dir(path) != real:
        return f"{os.path.dirname(path)} now leads to {real_dir(path)}, not {real}"
    now = signature(path)
    if now is None:
        return "gone"
    if now[0] != sig[0]:
        return "a file where a directory was, or the reverse"
    if len(sig) >= 5 and now[4] != sig[4]:
        return "another file (inode) than the one written"
    if now[3] != sig[3]:
        return "changed since it was written down"
    return None


class Lister:
    """The glob's matches, listed again only when the directory they lie in changed (a
    glob whose directory part is fixed: ``dir/ck-*``), else at every look. A directory
    changed within the last RECENT seconds is listed again too (its mtime may not show a
    second change within one tick of a coarse clock)."""

    RECENT = 2.0

    def __init__(self, pattern: str):
        self.pattern = pattern
        head, tail = os.path.split(pattern)
        self.dir = head if ckpaths.fixed_part(pattern) == head and tail and "**" not in tail else None
        self.stamp: tuple | None = None
        self.paths: list = []
        self.set: set = set()

    def look(self) -> bool:
        """List when needed; True when the listing was taken anew."""
        if self.dir is not None:
            try:
                st = os.stat(self.dir)
            except OSError:
                st = None
            stamp = (st.st_dev, st.st_ino, st.st_mtime_ns) if st else None
            if st is not None and stamp == self.stamp and time.time() - st.st_mtime > self.RECENT:
                return False
            self.stamp = stamp
        self.paths = matches(self.pattern)
        self.set = set(self.paths)
        return True
