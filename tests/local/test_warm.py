"""Warm means warmed: a warmup that succeeded leaves a marker (hash of the warmup
command and the profile) in the profile's cache; `when: cold` asks that marker,
not whether cache files exist."""

from __future__ import annotations

import yaml

from gpujob.agent.base import envs
from gpujob.ops.wheelhouse import build_indexes
from helpers import cli, events, job_id_of, local_env, write_spec


def run(tmp_path, env, spec, warmup: str) -> list:
    data = yaml.safe_load(spec.read_text())
    data["warmup"] = {"command": warmup, "when": "cold"}
    spec.write_text(yaml.safe_dump(data))
    p = cli(["submit", str(spec), "--follow"], env, timeout=120)
    assert p.returncode == 0, p.stdout.decode()[-2000:]
    return [e for e in events(tmp_path / "root" / "jobs" / job_id_of(p.stdout))
            if e["type"] in ("warmup_skipped", "warm_marked")
            or (e["type"] == "phase" and e["phase"] == "warmup")]


def test_a_warmup_that_compiles_nothing_runs_once(tmp_path):
    idx = {b: p.as_uri() for b, p in build_indexes(tmp_path / "wh").items()}
    env = local_env(tmp_path)
    spec = write_spec(tmp_path / "job.yaml", target="box", fast_url=idx["fast"], slow_url=idx["slow"],
                      profile="fast", throughput=False, trainer_args="--steps 1 --interval 0.01")
    first = run(tmp_path, env, spec, "echo nothing to compile")
    assert [e["type"] for e in first] == ["phase", "warm_marked"]
    caches = list((tmp_path / "root" / "caches").iterdir())
    assert [p.name for p in caches[0].iterdir()] == [envs.WARM_MARKER]  # no cache files, yet warm
    second = run(tmp_path, env, spec, "echo nothing to compile")
    assert [e["type"] for e in second] == ["warmup_skipped"] and second[0]["cache"] == "warm"
    third = run(tmp_path, env, spec, "echo another warmup")  # another command: cold again
    assert [e["type"] for e in third] == ["phase", "warm_marked"]
    # a failed warmup marks nothing
    data = yaml.safe_load(spec.read_text())
    data["warmup"] = {"command": "exit 3"}
    spec.write_text(yaml.safe_dump(data))
    assert cli(["submit", str(spec), "--follow"], env, timeout=120).returncode == 1
    assert envs.warm_state(str(tmp_path / "root"), caches[0].name, "x") != "warm"
    marker = yaml.safe_load((caches[0] / envs.WARM_MARKER).read_text())
    assert marker["was"] == "cold (marker of another warmup or profile)"
