"""The known-good ledger of wheel profiles (stdlib only): ``H/ledger/<job name>.json``,
one per job name (and fleet shape), with the history of every verdict.
"""

from __future__ import annotations

import os

from gpujob.agent.base.fsio import now, read_json, write_json
from gpujob.agent.home.journal import Home


class Ledger:
    """Known-good / bad wheel profiles for one job name in this container."""

    def __init__(self, home: Home, name: str):
        self.path = home.ledger_path(name)

    def read(self) -> dict:
        return read_json(self.path, {"profiles": {}})

    def mark(self, profile: str, status: str, **data) -> dict:
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        led = self.read()
        before = led["profiles"].get(profile)
        entry = dict(before or {})
        entry.update(data, status=status, at=now())
        led["profiles"][profile] = entry
        _relink(led)
        _record(led, profile, status, before, entry)
        write_json(self.path, led)
        return led

    def forget(self, profile: str, **data) -> dict:
        """Remove a profile's entry (it is untried again)."""
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        led = self.read()
        before = led["profiles"].pop(profile, None)
        _relink(led)
        _record(led, profile, "untried", before, dict(data, at=now()))
        write_json(self.path, led)
        return led

    def history(self) -> list:
        """Every verdict, oldest first, each with an id and its evidence; the entries of a
        ledger written before the history existed come first, as ``legacy``."""
        led = self.read()
        hist = list(led.get("history") or [])
        seen = {h["profile"] for h in hist}
        legacy = [dict(e, id=f"legacy-{p}", profile=p, legacy=True, time=e.get("at"))
                  for p, e in sorted((led.get("profiles") or {}).items()) if p not in seen and "status" in e]
        return legacy + hist

    def undo(self, verdict_id: str, **data) -> dict:
        """Revert one verdict: the profile's entry as it was before it (baseline included);
        the undo is itself a verdict in the history. Returns the record undone."""
        led = self.read()
        rec = next((h for h in self.history() if str(h["id"]) == str(verdict_id)), None)
        if rec is None:
            raise KeyError(verdict_id)
        profile = rec["profile"]
        current = led["profiles"].get(profile)
        before = None if rec.get("legacy") else rec.get("before")
        if before is None:
            led["profiles"].pop(profile, None)
        else:
            led["profiles"][profile] = dict(before)
        _relink(led)
        _record(led, profile, (before or {}).get("status", "untried"), current,
                dict(data, undoes=rec["id"], reason=f"undo of verdict {rec['id']}", at=now()))
        write_json(self.path, led)
        return rec

    def note(self, profile: str, **data) -> dict:
        """Add facts to a profile's entry (a snapshot, a cold proof) without changing
        its status or its time."""
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        led = self.read()
        led["profiles"].setdefault(profile, {"status": "untried"}).update(data)
        write_json(self.path, led)
        return led

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


def _relink(led: dict) -> None:
    """last_good: the newest good entry (none when no profile is good)."""
    goods = [(e.get("at", 0), p) for p, e in led["profiles"].items() if e.get("status") == "good"]
    if goods:
        led["last_good"] = max(goods)[1]
    else:
        led.pop("last_good", None)


_EVIDENCE = ("reason", "evidence", "baseline", "job", "by_hand", "undoes")


def _record(led: dict, profile: str, status: str, before, entry: dict) -> None:
    """Append one verdict to the ledger's history (ids count up, never reused)."""
    hist = led.setdefault("history", [])
    n = int(led.get("next_id") or len(hist) + 1)
    ev = entry.get("evidence") or {}
    hist.append(dict({k: entry[k] for k in _EVIDENCE if k in entry}, id=n, profile=profile, status=status,
                     time=entry.get("at"), before=before,
                     window_medians=ev.get("window_medians"), threshold=ev.get("threshold")))
    led["next_id"] = n + 1
