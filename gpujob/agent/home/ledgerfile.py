"""The ledger's file (stdlib only): ``H/ledger/<name>.json``, a JSON file written only under an
``flock`` of ``<name>.lock`` beside it, read strictly.

- **Reads** never follow a link (``O_NOFOLLOW``), never block (``O_NONBLOCK``: a FIFO is
  opened and refused), are bounded (``MAX_BYTES``), and refuse what is not a regular file,
  does not parse, has the wrong shape or a format newer than ``FORMAT``: ``Damaged``, one
  line (path, what is wrong, what to do). A missing file is an empty ledger.
- **Writes** (``locked``) take the lock (``Busy`` when it is not free within ``wait``), read
  the file strictly (damage is refused: nothing is written over it), remove the temp files
  of writers that died, replace the file atomically (temp, fsync, rename, fsync of the
  directory) and keep a copy of what was written in ``<name>.json.last-good`` (the recovery).
- **Formats**: 1 is the file of gpujob before the lock (no ``format`` key); 2 is this one. A
  format-1 file is read as is and written as format 2 by its next write; its bytes are kept
  once in ``<name>.json.v1``.
"""

from __future__ import annotations

import errno
import fcntl
import json
import math
import os
import re
import signal
import stat
import threading
import time

from gpujob.agent.base.fsio import write_bytes
from gpujob.agent.base.wire import Code, Refused

FORMAT = 2
MAX_BYTES = 8 << 20  # a ledger of 10 000 verdicts is ~5 MB
STATUSES = ("good", "bad", "untried")
PROFILE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,99}")  # as a spec names them (spec_types.Name)
COPY = ".last-good"
DAMAGED = ".damaged-"


class LedgerError(Refused):
    """One line for the user: the path, what is wrong, what to do."""

    code = Code.CONFLICT  # a write refused as it stands (nothing to recover, a wrong new ledger)


class Damaged(LedgerError):
    code = Code.DAMAGED


class Busy(LedgerError):
    code = Code.BUSY


def wait_s(default: float) -> float:
    """How long a writer waits for the lock: ``GPUJOB_LEDGER_WAIT`` seconds, else ``default``."""
    try:
        return max(0.0, float(os.environ.get("GPUJOB_LEDGER_WAIT", default)))
    except ValueError:
        return default


def recover_hint(path: str) -> str:
    name = os.path.basename(path)[:-5]
    return (f"nothing was written over it; `gpujob ledger recover TARGET {name}` keeps it aside as "
            f"{name}.json{DAMAGED}TIME and restores the last good copy ({name}.json{COPY})")


def damaged(path: str, what: str) -> Damaged:
    return Damaged(f"ledger {path}: {what}; {recover_hint(path)}")


def read_bytes(path: str):
    """The file's bytes, or None when there is none; ``Damaged`` for anything but a regular
    file of at most MAX_BYTES with one link. Never follows a link, never blocks."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise damaged(path, "is a symbolic link (a ledger is never read through a link)") from None
        if e.errno in (errno.ENXIO, errno.EISDIR):
            raise damaged(path, "is not a regular file") from None
        raise damaged(path, f"cannot be read ({e.strerror})") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            kind = "a FIFO" if stat.S_ISFIFO(st.st_mode) else "a directory" if stat.S_ISDIR(st.st_mode) \
                else "a device" if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode) else "a socket"
            raise damaged(path, f"is not a regular file ({kind})")
        if st.st_nlink > 1:
            raise damaged(path, f"has {st.st_nlink} hard links (another file's verdicts could be read)")
        if st.st_size > MAX_BYTES:
            raise damaged(path, f"is {st.st_size} bytes, over the {MAX_BYTES} a ledger may have")
        chunks, left = [], MAX_BYTES + 1
        while left > 0:
            b = os.read(fd, min(left, 1 << 20))
            if not b:
                break
            chunks.append(b)
            left -= len(b)
        data = b"".join(chunks)
        if len(data) > MAX_BYTES:
            raise damaged(path, f"is over the {MAX_BYTES} bytes a ledger may have")
        return data
    finally:
        os.close(fd)


def parse(path: str, data: bytes) -> dict:
    """The ledger in ``data`` (format 1 or 2), checked; ``Damaged`` with what is wrong."""
    if not data.strip():
        raise damaged(path, "is empty (does not parse)")
    try:
        led = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as e:  # RecursionError: nested too deep
        raise damaged(path, f"does not parse as JSON ({str(e)[:80]})") from None
    why = shape_error(led)
    if why:
        raise damaged(path, why)
    return led


def _num(v) -> bool:
    if isinstance(v, bool):
        return False
    return (isinstance(v, int) and abs(v) < 2 ** 53) or (isinstance(v, float) and math.isfinite(v))


# per field, what a value must be when present (None allowed): what a reader does with it
_NUM, _STR = ("a number", _num), ("a string", lambda v: isinstance(v, str))
_TIME = ("a time", lambda v: _num(v) and 0 <= v < 1e11)  # seconds since 1970, before the year 5000
ENTRY_FIELDS = {"at": _TIME, "baseline": _NUM, "proof": _STR, "reason": _STR, "env_key": _STR, "job": _STR}
VERDICT_FIELDS = {"time": _TIME, "baseline": _NUM, "threshold": _NUM, "reason": _STR, "job": _STR, "op": _STR,
                  "window_medians": ("a list of numbers",
                                     lambda v: isinstance(v, list) and all(map(_num, v))),
                  "before": ("an entry", lambda v: isinstance(v, dict) and _entry_error(v) is None)}


def _fields_error(where: str, d: dict, fields: dict):
    for k, (what, ok) in fields.items():
        if d.get(k) is not None and not ok(d[k]):
            return f"wrong shape: {where}.{k} is not {what}"
    return None


def _entry_error(e: dict):
    if e.get("status", "untried") not in STATUSES:
        return f"status {str(e.get('status'))[:20]!r} is not good/bad/untried"
    return _fields_error("entry", e, ENTRY_FIELDS)


def shape_error(led) -> str | None:
    """What is wrong with a parsed ledger's shape (None: nothing): every value a reader
    uses has its type, so no content of a ledger that passes can crash one."""
    if not isinstance(led, dict):
        return f"wrong shape: expected an object at the top, got {type(led).__name__}"
    fmt = led.get("format", 1)
    if type(fmt) is not int or fmt < 1:
        return f"wrong shape: format {str(fmt)[:20]!r} is not a format number"
    if fmt > FORMAT:
        return (f"format {fmt} is newer than this gpujob knows ({FORMAT}): upgrade gpujob on this "
                f"laptop (a newer one wrote it)")
    profiles = led.get("profiles")
    if not isinstance(profiles, dict):
        return f"wrong shape: profiles is {type(profiles).__name__}, expected an object"
    for p, e in profiles.items():
        if not PROFILE.fullmatch(p):
            return f"wrong shape: profile name {p[:40]!r} is not letters, digits, '_', '.' and '-'"
        if not isinstance(e, dict):
            return f"wrong shape: profiles.{p[:40]} is {type(e).__name__}, expected an object"
        why = _entry_error(e)
        if why:
            return f"wrong shape: profiles.{p[:40]}: {why}"
    hist = led.get("history", [])
    if not isinstance(hist, list):
        return f"wrong shape: history is {type(hist).__name__}, expected a list"
    for i, h in enumerate(hist):
        if not isinstance(h, dict) or type(h.get("id")) is not int or not 0 < h["id"] < 2 ** 53 \
                or not isinstance(h.get("profile"), str) or not PROFILE.fullmatch(h["profile"]) \
                or h.get("status") not in STATUSES:
            return f"wrong shape: history[{i}] is not a verdict (id, profile, status)"
        why = _fields_error(f"history[{i}]", h, VERDICT_FIELDS)
        if why:
            return why
    nid = led.get("next_id", 1)
    if type(nid) is not int or not 0 < nid < 2 ** 53:
        return "wrong shape: next_id is not a positive number"
    if led.get("last_good") is not None and not isinstance(led.get("last_good"), str):
        return "wrong shape: last_good is not a profile name"
    return None


def load(path: str) -> dict:
    """The ledger at ``path`` (an empty one when there is none), checked."""
    data = read_bytes(path)
    if data is None:
        return {"profiles": {}}
    return parse(path, data)


class _Late(Exception):
    pass


def _late(signum, frame):
    raise _Late()


def take(fd: int, wait: float) -> bool:
    """flock ``fd`` within ``wait`` seconds. A blocked ``flock`` is woken at each release (a
    writer that only polled could starve behind a tight one), so the main thread waits in it
    under a timer (SIGALRM, when nothing else handles it); elsewhere it polls."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        pass
    if wait > 0 and threading.current_thread() is threading.main_thread() and \
            signal.getsignal(signal.SIGALRM) in (signal.SIG_DFL, None) and \
            signal.getitimer(signal.ITIMER_REAL)[0] == 0:
        old = signal.signal(signal.SIGALRM, _late)
        try:
            signal.setitimer(signal.ITIMER_REAL, wait)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                return True
            except _Late:
                return False
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
        except _Late:  # the timer fired after the lock was got: it is held
            return True
        finally:
            signal.signal(signal.SIGALRM, old)
    end, pause = time.monotonic() + wait, 0.002
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() >= end:
                return False
            time.sleep(pause)
            pause = min(pause * 2, 0.02)


class locked:
    """``with locked(path, wait) as w: led = w.led; ...; w.write(led)``: the one door of
    every ledger write."""

    def __init__(self, path: str, wait: float, strict: bool = True):
        self.path, self.wait, self.strict = path, wait, strict
        self.fd: int | None = None
        self.led: dict = {}
        self.fmt = 1

    def __enter__(self) -> "locked":
        d = os.path.dirname(self.path)
        os.makedirs(d, exist_ok=True)
        lock = self.path[:-5] + ".lock"
        try:
            self.fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                              0o600)
        except OSError as e:
            raise Busy(f"ledger lock {lock}: cannot be opened ({e.strerror}); remove it if it is not a "
                       f"plain file (no ledger write holds it then)") from None
        if not stat.S_ISREG(os.fstat(self.fd).st_mode):
            os.close(self.fd)
            self.fd = None
            raise Busy(f"ledger lock {lock}: is not a regular file; remove it (no ledger write holds it)")
        if not take(self.fd, self.wait):
            os.close(self.fd)
            self.fd = None
            raise Busy(f"ledger {self.path}: another writer held its lock for {self.wait:g}s; "
                       f"nothing was written: try again")
        try:
            self.led = load(self.path) if self.strict else {"profiles": {}}
            if self.strict and not os.path.lexists(self.path):  # removed by hand: ids still go on
                try:
                    self.led["next_id"] = int(load(self.path + COPY).get("next_id") or 1)
                except Damaged:
                    pass
            self.fmt = self.led.get("format", 1) if self.strict and os.path.lexists(self.path) else FORMAT
            self._sweep()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def _sweep(self) -> None:
        """Remove the temp files of writers that died mid-write (none is alive: the lock)."""
        d = os.path.dirname(self.path)
        prefixes = tuple(os.path.basename(p)[:64] + ".tmp"
                         for p in (self.path, self.path + COPY, self.path + ".v1"))
        for n in os.listdir(d):
            if n.startswith(prefixes):
                try:
                    os.unlink(os.path.join(d, n))
                except OSError:
                    pass

    def write(self, led: dict) -> None:
        led = dict(led, format=FORMAT)
        why = shape_error(led)
        if why:  # never written: a bug of ours, said as one line
            raise LedgerError(f"ledger {self.path}: not written, the new ledger is wrong ({why})")
        if self.fmt < FORMAT:  # the first write of a format-1 ledger: its bytes are kept once
            old = read_bytes(self.path)
            v1 = self.path + ".v1"
            if old is not None and not os.path.lexists(v1):
                write_bytes(v1, old, 0o644)
            self.fmt = FORMAT
        payload = (json.dumps(led, indent=1, sort_keys=True) + "\n").encode()
        write_bytes(self.path, payload, 0o644)
        write_bytes(self.path + COPY, payload, 0o644)
        self.led = led

    def __exit__(self, *exc) -> None:
        if self.fd is not None:
            os.close(self.fd)  # drops the flock
            self.fd = None


_ID = re.compile(rb'"(?:id|next_id|undoes)"\s*:\s*([0-9]{1,12})')


def highest_id(data: bytes | None) -> int:
    """The highest verdict id to be found in a damaged file's bytes (ids are never reused)."""
    return max((int(m.group(1)) for m in _ID.finditer(data or b"")), default=0)


def recover(path: str, wait: float, t: float) -> dict:
    """Put a damaged ledger aside (kept, as ``<name>.json.damaged-TIME``) and restore its last
    good copy (an empty ledger when there is none); the next id comes after every id of
    either. Refused (``LedgerError``) when the ledger reads well."""
    d = os.path.dirname(path)
    os.makedirs(d, exist_ok=True)
    with locked(path, wait, strict=False):
        try:
            load(path)
            raise LedgerError(f"ledger {path}: reads well, nothing to recover")
        except Damaged as e:
            problem = str(e).split("; ", 1)[0]
        try:
            old = read_bytes(path)
        except Damaged:
            old = None
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(t))
        aside = f"{path}{DAMAGED}{stamp}"
        n = 1
        while os.path.lexists(aside):
            n += 1
            aside = f"{path}{DAMAGED}{stamp}.{n}"
        os.rename(path, aside)  # whatever it is (a link, a FIFO): renamed, never opened
        try:
            copy = load(path + COPY)
            source = os.path.basename(path + COPY)
        except Damaged:
            copy, source = {"profiles": {}}, None
        nid = max(int(copy.get("next_id") or 1), highest_id(old) + 1,
                  max((h["id"] for h in copy.get("history") or []), default=0) + 1)
        copy = dict(copy, next_id=nid, format=FORMAT)
        payload = (json.dumps(copy, indent=1, sort_keys=True) + "\n").encode()
        write_bytes(path, payload, 0o644)
        write_bytes(path + COPY, payload, 0o644)
        return {"problem": problem, "kept_as": aside, "restored_from": source,
                "verdicts": len(copy.get("history") or []), "next_id": nid}

