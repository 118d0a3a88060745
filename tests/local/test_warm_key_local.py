"""The warm marker's key on the local kind (issue 38 row 8): two submits that differ only in
``--save_steps``: the second skips the warmup (the key itself, per recipe: tests/unit/test_warm_key.py)."""

from __future__ import annotations

import yaml

from gpujob.ops.wheelhouse import build_indexes
from helpers import cli, events, job_id_of, local_env, write_spec


def test_a_changed_save_interval_alone_skips_the_warmup_on_the_local_kind(tmp_path):
    idx = {b: p.as_uri() for b, p in build_indexes(tmp_path / "wh").items()}
    env = local_env(tmp_path)
    spec = write_spec(tmp_path / "job.yaml", target="box", fast_url=idx["fast"], slow_url=idx["slow"],
                      profile="fast", throughput=False, trainer_args="--steps 1 --interval 0.01")
    data = yaml.safe_load(spec.read_text())

    def submit(every: int) -> list:
        data["warmup"] = {"command": f"echo warming --save_steps {every}", "when": "cold",
                          "ignore_flags": ["--save_steps"]}
        spec.write_text(yaml.safe_dump(data))
        p = cli(["submit", str(spec), "--follow"], env, timeout=180)
        assert p.returncode == 0, p.stdout.decode()[-2000:] + p.stderr.decode()[-2000:]
        return [e["type"] for e in events(tmp_path / "root" / "jobs" / job_id_of(p.stdout))
                if e["type"] in ("warmup_skipped", "warm_marked")]
    assert submit(200) == ["warm_marked"]
    assert submit(50) == ["warmup_skipped"]
