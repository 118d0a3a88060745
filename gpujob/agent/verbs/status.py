"""``status`` (the jobs' states; a job whose supervisor died is given a new one) and ``boot``
(at container start, the jobs marked resume_after_reboot revived). Stdlib only."""

from __future__ import annotations

import os

from gpujob.agent.base.protocol import ENDED, JobState
from gpujob.agent.home.journal import Home, Journal
from gpujob.agent.home.lock import Lock
from gpujob.agent.base.wire import StatusAnswer
from gpujob.agent.verbs.lifecycle import emit, job_or_refuse, revive, summary


def cmd_status(home: Home, args) -> None:
    """The jobs' states; a job whose supervisor died is given a new one (which
    re-adopts what still runs), and its entry says so under ``revived``."""
    ids = args.jobs or home.job_ids()  # oldest first
    older = 0
    if not args.jobs and getattr(args, "newest", None) is not None and len(ids) > max(0, args.newest):
        older = len(ids) - max(0, args.newest)
        ids = ids[older:]
    missing = [i for i in ids if not os.path.exists(Journal(home, i).path("job.json"))]
    if missing and not args.missing_ok:
        job_or_refuse(home, missing[0])
    ids = [i for i in ids if i not in missing]
    revived = {}
    if not args.no_revive:
        for i in ids:
            r = revive(home, i)
            if r:
                revived[i] = r
    jobs = []
    for i in ids:
        st = summary(home, i)
        if i in revived:
            st["revived"] = revived[i]
        jobs.append(st)
    jobs += [{"job_id": i, "state": JobState.NOT_FOUND, "reason": "no such job in this container (its submit "
              "never got there)"} for i in missing]
    emit(StatusAnswer(jobs, Lock(home.root).holder(), extra={"more": {"jobs": older}} if older else {}))


def cmd_boot(home: Home, args) -> None:
    """Run at container start by the boot hook: every job marked resume_after_reboot
    whose supervisor is gone gets a new one (which restarts its command)."""
    done = {}
    for job_id in home.job_ids():
        j = Journal(home, job_id)
        if not (j.job().get("spec") or {}).get("resume_after_reboot"):
            continue
        st = j.state()
        if st.get("state") in ENDED:
            continue
        j.event("container_booted")
        done[job_id] = revive(home, job_id) or {"revived": False, "why": "its supervisor runs"}
    emit({"booted": done})
