"""Issue 33 item 8 on the loopback Proxmox bed: a compile race with a known-good profile on
the ledger rolls back to it (ssh -> pct -> a real LXC container, profiles built by uv from
the loopback index), resumed from this job's newest finished checkpoint, the raced profile
a suspect that is marked bad once the known-good held (throughput is not watched here: its
trainer's exit 0 is that); no restart on the raced wheels.
The unit rule is tests/unit/test_decide.py, the local run tests/local/test_race_rollback.py."""

from __future__ import annotations

import json

import pytest
import yaml

from helpers import cli, cli_json, job_id_of, wait_for, write_spec
# bed_env: the fixture (a container home of this test's own)
from test_jobs_testbed import bed_env, home_path  # noqa: F401

pytestmark = pytest.mark.testbed

FX = "torch._dynamo.exc.Unsupported: is_fx_symbolic_tracing() is True"


def test_a_compile_race_with_a_known_good_profile_rolls_back_to_it_on_the_bed(
        testbed, bed_env, tmp_path, index):
    env = bed_env
    spec = write_spec(tmp_path / "job.yaml", target="ct200", fast_url=index["fast"], slow_url=index["slow"],
                      profile="slow", warmup=False, throughput=False, rollback={"confirm": "1s"},
                      trainer_args=f"--steps 400 --interval 0.05 --checkpoint-every 10 --fail-on-build slow "
                                   f"--fail-step 30 --fail-message '{FX}'")
    data = yaml.safe_load(spec.read_text())
    data["train"]["checkpoint"] = {"path": "checkpoint.json", "every": "1s", "settle": "0.3s"}
    spec.write_text(yaml.safe_dump(data))
    cli(["ledger", "set", "ct200", "tjob", "fast", "good"], env, check=True)
    job_id = job_id_of(cli(["submit", str(spec)], env, check=True).stdout)
    try:
        def ended():
            st = cli_json(["status", job_id, "--json"], env)
            return st if st.get("state") in ("succeeded", "failed", "stopped") else None
        try:
            st = wait_for(ended, 300, every=2, what="the job's end")
        except AssertionError:
            jdir = home_path(testbed, env, "jobs", job_id)
            raise AssertionError(json.dumps(cli_json(["status", job_id, "--json"], env))[-3000:] +
                                 (jdir / "events.jsonl").read_text()[-6000:]) from None
        assert (st["state"], st["profile"]) == ("succeeded", "fast"), st
        assert st["ledger"]["slow"]["status"] == "bad", st["ledger"]  # once fast's trainer ended well
        assert [(r["from"], r["to"], r["signal"]) for r in st["rollbacks"]] == \
            [("slow", "fast", "compile_race")]
        assert "is_fx_symbolic_tracing" in st["rollbacks"][0]["reason"]
        assert st["ledger"]["fast"]["status"] == "good"
        jdir = home_path(testbed, env, "jobs", job_id)
        ev = [json.loads(ln) for ln in (jdir / "events.jsonl").read_text().splitlines() if ln.strip()]
        # no restart on the raced wheels: a known-good was there (before item 8: three, then the rollback)
        assert [(e["signal"], e["profile"]) for e in ev if e["type"] == "restart"] == []
        [point] = [e for e in ev if e["type"] == "resume_point"]
        assert point["file"] and point["file"].endswith("checkpoint.json"), point
        trains = [e for e in ev if e["type"] == "phase" and e["phase"] == "train"]
        assert [t["profile"] for t in trains] == ["slow", "fast"]
        assert trains[1]["argv"][-1].endswith("--resume")
        log = (jdir / "train.log").read_text()
        assert "resumed from checkpoint at step 20" in log or \
            "resumed from checkpoint at step 10" in log, log[-2000:]
        text = cli(["status", job_id], env, check=True).stdout.decode()
        assert "slow → fast" in text and "compile_race" in text, text
    finally:
        cli(["stop", job_id], env, timeout=180)
