"""The job's gauges in Prometheus' text exposition format (stdlib only), written by
the supervisor to a file that node_exporter's textfile collector reads
(``--collector.textfile.directory``). The same gauges are in ``status --json``.

The file is replaced atomically (a temp file beside it, then a rename: the
collector never reads half of one), at most once per ``metrics.every`` while
samples come and at once on every state change.
"""

from __future__ import annotations

import math
import time

from gpujob.agent.base import defaults
from gpujob.agent.base.planshare import textfile_path
from gpujob.agent.base.fsio import write_bytes
from gpujob.agent.base.protocol import JobState

STATES = tuple(s.value for s in JobState if s not in (JobState.NOT_FOUND, JobState.UNKNOWN))  # a job's own

_GAUGES = (  # (name, key in gauges(), help)
    ("gpujob_tokens_per_second", "tok_s", "Last throughput sample of the job (tokens/s)."),
    ("gpujob_window_median_tokens_per_second", "window_median",
     "Median of the throughput policy's last window (tokens/s)."),
    ("gpujob_threshold_tokens_per_second", "threshold",
     "Throughput below which a window breaches (tokens/s)."),
    ("gpujob_known_good_baseline_tokens_per_second", "baseline",
     "Known-good baseline of the profile the job runs on (tokens/s)."),
)


def gauges(st: dict, job_id: str, name: str | None) -> dict:
    """The job's gauges from its state (pure): what the textfile and status --json carry."""
    window = st.get("window") or {}
    return {"job": job_id, "name": name, "profile": st.get("profile"), "state": st.get("state"),
            "tok_s": st.get("tps"), "window_median": window.get("median"),
            "threshold": window.get("threshold"), "baseline": st.get("baseline"),
            "rollbacks": len(st.get("rollbacks") or []), "verdict": st.get("verdict")}


def escape(value) -> str:
    """A label value as the text format wants it: backslash, double quote and newline escaped."""
    return str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _labels(**labels) -> str:
    return "{" + ",".join(f'{k}="{escape(v)}"' for k, v in labels.items() if v is not None) + "}"


def _number(value) -> str | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return repr(float(value)) if isinstance(value, float) else str(value)


def exposition(g: dict, at: float) -> str:
    """The text exposition of ``gauges()``; a gauge with no value yet is left out."""
    job = {"job_id": g["job"], "job_name": g["name"]}
    lines = []
    for metric, key, help_ in _GAUGES:
        value = _number(g.get(key))
        lines += [f"# HELP {metric} {help_}", f"# TYPE {metric} gauge"]
        if value is not None:
            lines.append(f"{metric}{_labels(**job, profile=g['profile'])} {value}")
    lines += ["# HELP gpujob_rollbacks_total Rollbacks of the job so far (automatic and by hand).",
              "# TYPE gpujob_rollbacks_total counter",
              f"gpujob_rollbacks_total{_labels(**job)} {int(g['rollbacks'])}",
              "# HELP gpujob_state 1 for the state the job is in, 0 for the others.",
              "# TYPE gpujob_state gauge"]
    lines += [f"gpujob_state{_labels(**job, state=s)} {int(s == g['state'])}" for s in STATES]
    lines += ["# HELP gpujob_metrics_updated_timestamp_seconds When the supervisor wrote this file.",
              "# TYPE gpujob_metrics_updated_timestamp_seconds gauge",
              f"gpujob_metrics_updated_timestamp_seconds{_labels(**job)} {round(at, 3)!r}"]
    return "\n".join(lines) + "\n"


class MetricsFile:
    """The supervisor's writer: rate-limited, and a failure is one journal event, never
    a job failure."""

    def __init__(self, journal, job: dict):
        cfg = defaults.section(job.get("spec") or {}, "metrics")
        self.journal = journal
        self.name = (job.get("spec") or {}).get("name")
        self.path = textfile_path(journal.dir, journal.job_id, cfg["textfile"]) if cfg else None
        self.every = float(cfg["every"]) if cfg else 0.0
        self.last: float | None = None
        self.failed = False

    def write(self, force: bool = False) -> None:
        if self.path is None:
            return
        t = time.monotonic()
        if not force and self.last is not None and t - self.last < self.every:
            return
        self.last = t
        text = exposition(gauges(self.journal.state(), self.journal.job_id, self.name), time.time())
        try:
            write_bytes(self.path, text.encode(), mode=0o644, durable=False)
            self.failed = False
        except OSError as e:
            if not self.failed:  # once, not once a second
                self.journal.event("metrics_error", path=self.path, error=f"{e.strerror or e}")
            self.failed = True
