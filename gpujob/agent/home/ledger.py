"""The known-good ledger of wheel profiles (stdlib only): ``H/ledger/<job name>.json``,
one per job name (and fleet shape), with the history of every verdict. The file, its lock,
its checks and its recovery are ledgerfile's.
"""

from __future__ import annotations

import json

from gpujob.agent.base.fsio import now
from gpujob.agent.home import ledgerfile
from gpujob.agent.home.journal import Home
from gpujob.agent.home.ledgerfile import LedgerError


class Superseded(Exception):
    """An undo refused: a later verdict on the same profile stands in the way."""


class Ledger:
    """Known-good / bad wheel profiles for one job name in this container. Every write is one
    locked read-modify-write (ledgerfile.locked). ``report`` None (the verbs): a damaged ledger
    or a lock not got in time raises ``LedgerError``; else (the supervisor) ``report(line)``
    says it, a read gives an empty ledger and a write is not done (returns None)."""

    def __init__(self, home: Home, name: str, report=None):
        self.path = home.ledger_path(name)
        self.report = report
        self.wait = ledgerfile.wait_s(10.0 if report is None else 30.0)
        self.last: dict = {}  # the verdict the last write recorded
        self._said: set = set()

    def _trouble(self, e: LedgerError):
        if self.report is None:
            raise e
        if str(e) not in self._said:
            self._said.add(str(e))
            self.report(str(e))

    def read(self) -> dict:
        try:
            return ledgerfile.load(self.path)
        except LedgerError as e:
            self._trouble(e)
            return {"profiles": {}}

    def _write(self, change):
        """One locked read-modify-write: ``change(led)`` edits the ledger read under the lock
        (False: nothing to write). Returns the ledger, or None when it was not written."""
        try:
            with ledgerfile.locked(self.path, self.wait) as w:
                led = json.loads(json.dumps(w.led))
                led.setdefault("profiles", {})
                if change(led) is not False:
                    w.write(led)
                return led
        except LedgerError as e:
            self._trouble(e)
            return None

    def mark(self, profile: str, status: str, op: str | None = None, **data):
        """``profile`` is ``status`` now. ``op`` names the act that decided it (a job's
        confirmation, a rollback): a verdict with the same op already in the history is not
        recorded again (a supervisor that died after its mark does it once more)."""
        def change(led):
            if op is not None and any(h.get("op") == op for h in led.get("history") or []):
                return False
            before = led["profiles"].get(profile)
            entry = dict(before or {})
            entry.update(data, status=status, at=now())
            led["profiles"][profile] = entry
            _relink(led)
            self.last = _record(led, profile, status, before, dict(entry, op=op) if op else entry)
        return self._write(change)

    def forget(self, profile: str, **data):
        """Remove a profile's entry (it is untried again)."""
        def change(led):
            before = led["profiles"].pop(profile, None)
            _relink(led)
            self.last = _record(led, profile, "untried", before, dict(data, at=now()))
        return self._write(change)

    def history(self) -> list:
        """Every verdict, oldest first, each with an id and its evidence; the entries of a
        ledger written before the history existed come first, as ``legacy``."""
        return _history(self.read())

    def undo(self, verdict_id: str, **data) -> dict:
        """Revert one verdict: the profile's entry as it was before it (baseline included);
        the undo is itself a verdict in the history. Refused (``Superseded``) when a later
        verdict on the same profile stands in the way; ``KeyError`` for an unknown id.
        Returns the record undone."""
        found: dict = {}

        def change(led):
            hist = _history(led)
            at = next((i for i, h in enumerate(hist) if str(h["id"]) == str(verdict_id)), None)
            if at is None:
                raise KeyError(verdict_id)
            rec = found["rec"] = hist[at]
            later = [h for h in hist[at + 1:] if h["profile"] == rec["profile"]]
            if later:
                raise Superseded(later[-1])
            profile = rec["profile"]
            current = led["profiles"].get(profile)
            before = None if rec.get("legacy") else rec.get("before")
            if before is None:
                led["profiles"].pop(profile, None)
            else:
                led["profiles"][profile] = dict(before)
            _relink(led)
            self.last = _record(led, profile, (before or {}).get("status", "untried"), current,
                                dict(data, undoes=rec["id"], reason=f"undo of verdict {rec['id']}", at=now()))
        if self._write(change) is None:
            raise LedgerError(f"ledger {self.path}: the undo was not written")
        return found["rec"]

    def note(self, profile: str, **data):
        """Add facts to a profile's entry (a snapshot, a cold proof) without changing
        its status or its time."""
        return self._write(lambda led: led["profiles"].setdefault(profile, {"status": "untried"})
                           .update(data))

    def recover(self) -> dict:
        """A damaged ledger put aside (kept) and its last good copy restored (ledgerfile.recover)."""
        return ledgerfile.recover(self.path, self.wait, now())

    @staticmethod
    def ever_good(led: dict) -> bool:
        """Whether this ledger ever had a known-good profile (its history, or today's entries)."""
        return any(h.get("status") == "good" for h in led.get("history") or []) or \
            any(e.get("status") == "good" for e in (led.get("profiles") or {}).values())

    def status(self, profile: str) -> str:
        return self.read()["profiles"].get(profile, {}).get("status", "untried")

    def baseline(self, profile: str):
        e = self.read()["profiles"].get(profile, {})
        return e.get("baseline") if e.get("status") == "good" else None

    def last_good(self, exclude: str | None = None):
        """The most recently proven good profile other than ``exclude``."""
        led = self.read()
        goods = [(e.get("at", 0), p) for p, e in led["profiles"].items()
                 if e.get("status") == "good" and p != exclude]
        return max(goods)[1] if goods else None


def _history(led: dict) -> list:
    hist = list(led.get("history") or [])
    seen = {h["profile"] for h in hist}
    legacy = [dict(e, id=f"legacy-{p}", profile=p, legacy=True, time=e.get("at"))
              for p, e in sorted((led.get("profiles") or {}).items()) if p not in seen and "status" in e]
    return legacy + hist


def _relink(led: dict) -> None:
    """last_good: the newest good entry (none when no profile is good)."""
    goods = [(e.get("at", 0), p) for p, e in led["profiles"].items() if e.get("status") == "good"]
    if goods:
        led["last_good"] = max(goods)[1]
    else:
        led.pop("last_good", None)


_EVIDENCE = ("reason", "evidence", "baseline", "job", "by_hand", "undoes", "op")


def _record(led: dict, profile: str, status: str, before, entry: dict) -> dict:
    """Append one verdict to the ledger's history (ids count up, never reused); returns it."""
    hist = led.setdefault("history", [])
    n = max(int(led.get("next_id") or 1), max((h["id"] for h in hist if type(h.get("id")) is int), default=0)
            + 1)
    ev = entry.get("evidence") or {}
    hist.append(dict({k: entry[k] for k in _EVIDENCE if k in entry}, id=n, profile=profile, status=status,
                     time=entry.get("at"), before=before,
                     window_medians=ev.get("window_medians"), threshold=ev.get("threshold")))
    led["next_id"] = n + 1
    return hist[-1]
