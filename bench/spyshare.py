"""Where a supervisor's time went, from py-spy's collapsed stacks (``--format raw``, as
``python -m bench.supervisor_cpu --pyspy PREFIX`` records them), grouped by cause.

    python -m bench.spyshare [--no-wait] /tmp/spy-this-*.txt -- /tmp/spy-other-*.txt

Each sample counts once, for the first cause (in the order below) whose frame is in its
stack; the shares are of the samples in which the supervisor ran Python. Several files
before a ``--`` add up to one column; each ``--`` starts another column. ``--no-wait``
leaves the wait out of the total: py-spy counts a thread as running from its wakeup on,
also while it waits for a CPU, so on a loaded machine the wait's share says more about
the load than about the supervisor.
"""

from __future__ import annotations

import sys

WAIT = "the wait (select)"
# (cause, frames: "function (file" as py-spy writes a frame), first match wins; "Watch.x (" also
# matches the frames of recordings made before the watch was an object (PhaseWatch.x, PauseWatch._pay)
CAUSES = (
    ("per sample: decide's reason and evidence", ("(reasons.py",)),  # (after the split; inside decide before)
    ("per sample: policy.decide", ("decide (policy.py", "_windows (policy.py", "judging_start (policy.py",
                                   "threshold (policy.py", "_windows.<locals>")),
    ("per sample: policy.known_good", ("known_good (policy.py",)),
    ("per sample: state.json (publish)", ("Watch.publish (", "Journal.set_state (", "Metrics.write (")),
    ("per sample: samples.jsonl record", ("Journal.sample (",)),
    ("per sample: decision events", ("Journal.event (",)),
    ("per sample: the rest of judge_sample", ("judge_sample (", "Watch.on_sample (", "Verdicts.review (",
                                             "RankMerge.", "pending (timings.py", "on_sample (timings.py")),
    ("per line: tok/s and step parsing", ("from_line (", "parse (throughput.py", "candidates (",
                                          "make_parser.<locals>", "make_step_parser.<locals>")),
    ("per line: the trace record and the tail", ("TraceWriter.", "Watch._pay (")),
    ("per line: the splitter", ("LineSplitter.",)),
    ("per line: signatures", ("may_hit", "scan_line (")),
    ("per read: the relay into job.log", ("Relay.", "JobLog.")),
    ("every 0.2 s: checks, requests, trims", ("Watch.check (", "poll_source (", "keep_small (", "Trimmer.",
                                              "Supervisor.requests (", "poll_checkpoints (")),
    (WAIT, ("Watch.nap (", "Runner.nap (", "after_read (logwait.py", "LogWait.", "_Inotify.")),
)
OTHER = "the loop itself, the rest"


def cause_of(stack: str) -> str:
    for name, frames in CAUSES:
        if any(f in stack for f in frames):
            return name
    return OTHER


def shares(paths: list, no_wait: bool = False) -> tuple:
    """({cause: samples}, total) over the collapsed-stack files ``paths``."""
    got: dict = {}
    total = 0
    for path in paths:
        with open(path) as f:
            for line in f:
                stack, _, n = line.rstrip("\n").rpartition(" ")
                if not n.isdigit() or "Watch.watch (" not in stack:  # the watch loop's time only
                    continue
                cause = cause_of(stack)
                if no_wait and cause == WAIT:
                    continue
                got[cause] = got.get(cause, 0) + int(n)
                total += int(n)
    return got, total


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    no_wait = "--no-wait" in argv
    argv = [a for a in argv if a != "--no-wait"]
    cols, cur = [], []
    for a in argv:
        if a == "--":
            cols.append(cur)
            cur = []
        else:
            cur.append(a)
    cols.append(cur)
    if not any(cols):
        print("usage: python -m bench.spyshare FILE... [-- FILE...]", file=sys.stderr)
        return 2
    results = [shares(c, no_wait) for c in cols]
    names = [n for n, _ in CAUSES] + [OTHER]
    print("| cause | " + " | ".join(f"column {i + 1} ({t} samples)" for i, (_, t) in enumerate(results))
          + " |")
    print("|---|" + "---|" * len(results))
    for n in names:
        if not any(g.get(n) for g, _ in results):
            continue
        print(f"| {n} | " + " | ".join(f"{100 * g.get(n, 0) / max(1, t):.1f} %" for g, t in results) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
