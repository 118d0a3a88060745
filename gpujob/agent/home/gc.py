"""Disk use of profile venvs and their garbage collection (stdlib only).

uv links files from its cache into each venv, so a venv's *apparent* size (the
sum of file sizes) says little: ``disk_usage`` also counts each inode once
(``real``) and what only this venv holds (``own``: files with one link, what
removing it frees). ``gc`` removes venvs not used for N days, never the venv of a
job still running and never one of a profile that a ledger calls known-good.
"""

from __future__ import annotations

import os
import time

USED_MARKER = ".gpujob-used"


def disk_usage(paths: list) -> dict:
    """{apparent, real, own} bytes of the files under ``paths`` together."""
    seen, apparent, real, own = set(), 0, 0, 0
    for top in paths:
        for root, _dirs, files in os.walk(top):
            for name in files:
                try:
                    st = os.lstat(os.path.join(root, name))
                except OSError:
                    continue
                apparent += st.st_size
                if (st.st_dev, st.st_ino) in seen:
                    continue
                seen.add((st.st_dev, st.st_ino))
                blocks = st.st_blocks * 512
                real += blocks
                if st.st_nlink == 1:
                    own += blocks
    return {"apparent": apparent, "real": real, "own": own}


def touch_used(venv: str) -> None:
    """Record that a job activated this venv now (its mtime is the last use)."""
    try:
        fd = os.open(os.path.join(venv, USED_MARKER),
                     os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        with open(fd, "w") as f:
            f.write(str(time.time()))
    except OSError:
        pass


def last_used(venv: str, marker: dict) -> float:
    try:
        return os.stat(os.path.join(venv, USED_MARKER)).st_mtime
    except OSError:
        return float(marker.get("built_at") or 0.0)


def protected_by_ledgers(ledgers: dict) -> tuple:
    """(env keys, profile names) a ledger calls known-good: never collected."""
    keys, names = set(), set()
    for led in ledgers.values():
        for profile, entry in (led.get("profiles") or {}).items():
            if entry.get("status") == "good":
                names.add(profile)
                if entry.get("env_key"):
                    keys.add(entry["env_key"])
    return keys, names


def select(envs: list, days: float, now: float, active: set, good_keys: set, good_names: set,
           hold: str | None = None) -> list:
    """Pure: [(env, why)] for every venv; why is "remove" or the reason it stays.
    ``envs`` holds dicts with env_key, profile and last_used. ``hold``: why nothing may be
    removed (a ledger that cannot be read may call any of them known-good)."""
    out = []
    for e in envs:
        age = (now - e["last_used"]) / 86400
        if e["env_key"] in active:
            why = "active: a running job uses it"
        elif e["env_key"] in good_keys or (e.get("profile") and e["profile"] in good_names):
            why = "known-good"  # by name too: a ledger entry may predate env keys in it
        elif age < days:
            why = f"used {age:.1f} days ago"
        elif hold:
            why = hold
        else:
            why = "remove"
        out.append((e, why))
    return out


def read_ledgers(ldir: str) -> tuple:
    """({name: ledger}, [the line of each ledger that cannot be read])."""
    from gpujob.agent.home import ledgerfile
    out, bad = {}, []
    for name in sorted(os.listdir(ldir)) if os.path.isdir(ldir) else []:
        if name.endswith(".json"):
            try:
                out[name[:-5]] = ledgerfile.load(os.path.join(ldir, name))
            except ledgerfile.LedgerError as e:
                bad.append(str(e))
    return out, bad
