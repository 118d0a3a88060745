"""One run of a phase command as the watch loop knows it (``Run``), and the GPUs'
utilisation that its idle check reads (stdlib only; agent/supervisor/watch.py)."""

from __future__ import annotations

import collections
import subprocess

from gpujob.agent.base.fsio import now
from gpujob.agent.judge.coalesce import Verdicts

TAIL_LINES = 200


class Run:
    """What one run of a phase command knows while the supervisor watches it; built with
    the job (``parts.Job``: the spec, the rollback section) and the ledger (its baseline)."""

    def __init__(self, job, ledger, logname: str, profile: str, timeout, watch_tps: bool,
                 start: float | None = None):
        self.phase = logname[:-len(".log")]
        self.profile = profile
        self.timeout = timeout
        self.watch_tps = watch_tps
        self.start = start or now()
        self.samples: list = []
        self.baseline = (job.spec.get("throughput") or {}).get("baseline") or ledger.baseline(profile) or \
            ledger.baseline(ledger.last_good() or "")  # the user's (throughput.baseline) first
        self.good_known = ledger.status(profile) == "good"
        self.tail: collections.deque = collections.deque(maxlen=TAIL_LINES)
        self.hits: list = []
        self.hit_at: tuple | None = None  # (when, signal) of the first error signature printed
        self.last_state = self.last_check = self.last_gpu = 0.0
        self.good_asked = float("-inf")  # when known_good was last asked (watch.KNOWN_GOOD_EVERY)
        self.last_trim = self.start
        self.minute: list = []  # sample values since the last samples_1m summary
        self.minute_start = self.start
        self.save_time = 0.0  # the longest checkpoint save seen (GPUs idle meanwhile)
        self.held = None  # an automatic rollback waiting for the first checkpoint
        self.held_at = 0.0
        self.held_told = 0.0  # how long it had waited when job.log last said so
        self.ck_seen = False
        self.ck_refused = None  # why the checkpoint glob, resolved through links, is refused (said once)
        self.cold_cache = False  # the run started on a cold compile cache (Watch.new_run)
        self.source = None  # its throughput source (judge/sources.py), when throughput is watched
        self.ckwatch = None  # this run's checkpoint watch (ckregister.CkWatch), train only
        self.last_verdict = None
        self.verdicts = Verdicts()  # decision events: one per change of verdict (agent/judge/coalesce.py)
        self.idle_cfg = job.rb.get("gpu_idle") if logname == "train.log" else None
        gpus = job.spec.get("gpus") or {}
        self.idle_gpus: list = []
        if self.idle_cfg:
            self.idle_gpus = list(gpus[self.idle_cfg["group"]]) if self.idle_cfg.get("group") else \
                sorted({g for ids in gpus.values() for g in ids})
        self.idle_poll = min(10.0, max(0.5, self.idle_cfg["for"] / 5)) if self.idle_cfg else 0
        self.gpu_history: list = []


def gpu_utilisation(gpus: list) -> float | None:
    """The busiest of ``gpus`` (percent) from nvidia-smi, or None when it cannot tell."""
    try:
        p = subprocess.run(["nvidia-smi", "--query-gpu=index,utilization.gpu",
                            "--format=csv,noheader,nounits"], capture_output=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    util = {}
    for line in p.stdout.decode("utf-8", "replace").splitlines():
        parts = [x.strip() for x in line.split(",")]
        if len(parts) == 2 and parts[0].isdigit():
            try:
                util[int(parts[0])] = float(parts[1])
            except ValueError:
                pass
    seen = [util[g] for g in gpus if g in util]
    return max(seen) if seen and len(seen) == len(gpus) else None
