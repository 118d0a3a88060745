"""Issue 38 item 1 on the loopback Proxmox bed: a slow profile is caught and rolled back with
only the keys `gpujob init` writes (``min_ratio`` and the rate source) and gpujob's defaults
for every other judging key. The baseline comes from a first job on the fast profile (its
``good_after`` shortened with ``--set`` to 15 s, past the default 10 s window it must hold:
the default, 10 minutes, would hold the bed that long); the slow job then runs with nothing
set. What is asserted is what the user reads: the rollback, its signal, where it went, and the
ledger's verdict; never how long it took."""

from __future__ import annotations

import json

import pytest
import yaml

from helpers import cli, cli_json, job_id_of, wait_for, write_spec
from test_jobs_testbed import bed_env  # noqa: F401  (the fixture: a container home of this test's own)

pytestmark = pytest.mark.testbed


def event_types(job_id: str, env) -> list:
    p = cli(["logs", job_id, "--events", "--json"], env)
    return [json.loads(ln).get("type") for ln in p.stdout.decode().splitlines() if ln.startswith("{")]


def test_a_slow_profile_is_rolled_back_at_the_keys_init_writes(testbed, bed_env, tmp_path, index):
    env = bed_env
    spec = write_spec(tmp_path / "job.yaml", target="ct200", fast_url=index["fast"], slow_url=index["slow"],
                      profile="fast", trainer_args="--steps 100000 --interval 0.1", warmup=False,
                      throughput={"format": "ktok", "min_ratio": 0.8})
    assert set(yaml.safe_load(spec.read_text())["throughput"]) == {"format", "min_ratio"}
    first = job_id_of(cli(["submit", str(spec), "--set", "throughput.good_after=15s"], env,
                          check=True).stdout)
    try:
        wait_for(lambda: "known_good" in event_types(first, env), 300, every=2,
                 what="fast to become known-good")
    finally:
        cli(["stop", first], env, timeout=180)
    second = job_id_of(cli(["submit", str(spec), "--profile", "slow"], env, check=True).stdout)
    try:
        st = wait_for(lambda: (lambda s: s if s.get("rollbacks") else None)(
                          cli_json(["status", second, "--json"], env)),
                      400, every=2, what="the rollback of slow at the defaults")
        [rb] = st["rollbacks"]
        assert (rb["from"], rb["to"], rb["signal"]) == ("slow", "fast", "low_throughput"), rb
        text = cli(["status", second], env, check=True).stdout.decode()
        assert "slow" in text and "fast" in text and "low_throughput" in text, text
    finally:
        cli(["stop", second], env, timeout=180)
