"""Issue 38 item 7 on the loopback Proxmox bed: the judge's cost follows its samples, not the
run's age, with a pause every few seconds. A trainer prints a line that opens a pause every
~5 s (``pause_pattern``, a 1 s ``pause_tail``: with the 2 s lead, 3 s of every 5 paused) for
~100 s, judged at gpujob's default time window and failure_limit. Each ``pause`` event carries
the judge's work so far (agent/judge/tail.py: the samples new to it, the elements it touched);
the work per sample in the run's last stretch must stay within 1.5x of its first. A judge that
reaches back by all paused time so far (issue 38 row 9) touched ~3x more per sample by then.
Work, not CPU time: the suite runs on a loaded machine (the CPU ratio is bench.supervisor_cpu
--age, BENCHMARKS.md)."""

from __future__ import annotations

import json

import pytest

from helpers import cli, cli_json, job_id_of, wait_for, write_spec
# bed_env: the fixture (a container home of this test's own)
from test_jobs_testbed import bed_env, home_path  # noqa: F401

pytestmark = pytest.mark.testbed


def per_sample(points) -> float:
    (_, s0, w0), (_, s1, w1) = points[0], points[-1]
    return (w1 - w0) / max(1, s1 - s0)


def test_the_judges_work_per_sample_stays_flat_over_a_run_with_a_pause_every_few_seconds(
        testbed, bed_env, tmp_path, index):
    env = bed_env
    spec = write_spec(tmp_path / "job.yaml", target="ct200", fast_url=index["fast"], slow_url=index["slow"],
                      profile="fast", warmup=False, trainer_args="--steps 2000 --interval 0.05",
                      throughput={"format": "ktok", "min": "10K", "pause_pattern": r"^step \d*00 \|",
                                  "pause_tail": "1s"})
    job_id = job_id_of(cli(["submit", str(spec)], env, check=True).stdout)
    try:
        st = wait_for(lambda: (lambda s: s if s.get("state") in ("succeeded", "failed", "stopped") else None)(
            cli_json(["status", job_id, "--json"], env)), 400, every=3, what="the run's end")
        assert st["state"] == "succeeded", st
        events = [json.loads(ln) for ln in (home_path(testbed, env, "jobs", job_id, "events.jsonl"))
                  .read_text().splitlines() if ln.strip()]
        assert not [e for e in events if e["type"] == "decision" and e["verdict"] in ("breach", "rollback")]
        points = [(e["t"], e["judge_work"]["samples"], e["judge_work"]["touched"]) for e in events
                  if e["type"] == "pause" and e.get("judge_work")]
        assert len(points) >= 15, points  # a pause every ~5 s for ~100 s
        third = len(points) // 3
        first, last = per_sample(points[:third + 1]), per_sample(points[-third - 1:])
        assert points[-1][1] > 1000 and first > 0, points
        assert last <= 1.5 * first, (first, last, points)
    finally:
        cli(["stop", job_id], env, timeout=180)
