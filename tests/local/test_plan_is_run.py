"""The plan is what runs: `gpujob submit --plan --json` lists the commands the
supervisor then really runs (venv build, per-GPU warmup, train), compared with the
argv the supervisor journals for the same job on the `local` target (real CLI, real
supervisor, real uv; GPUs mocked by the spec's GPU lists). Any drift between
gpujob.ops.plan.build_plan and the supervisor fails here."""

from __future__ import annotations

import os

import yaml

from helpers import cli, cli_json, events, local_env, write_spec


def same_command(shown: list, ran: list) -> bool:
    """The plan shows a long inline script as ``<what it does>``, and uv by name (which
    uv submit finds or ships is known only then): every other word matches."""
    if shown[:1] == ["uv"] and ran[:1] and os.path.basename(ran[0]) == "uv":
        ran = ["uv", *ran[1:]]
    return len(shown) == len(ran) and all(s == r or (s.startswith("<") and s.endswith(">"))
                                          for s, r in zip(shown, ran))


def test_plan_commands_are_the_commands_the_supervisor_runs(tmp_path, index_urls):
    env = local_env(tmp_path)
    spec = write_spec(tmp_path / "job.yaml", target="box", fast_url=index_urls["fast"],
                      slow_url=index_urls["slow"], profile="fast", throughput=False,
                      trainer_args="--steps 2 --interval 0.01 --checkpoint {workdir}/ck-{job_id}.json")
    doc = yaml.safe_load(spec.read_text())
    doc["warmup"]["command"] = "python warmup.py  # gpu {gpu} of {gpus.drafter}"
    spec.write_text(yaml.safe_dump(doc, sort_keys=False))
    job_id = "tjob-plan-is-run"
    plan = cli_json(["submit", str(spec), "--plan", "--json", "--job-id", job_id], env)
    assert plan["job_id"] == job_id
    shown = {kind: [s["argv"] for s in plan["steps"] if s["kind"] == kind and s["argv"]]
             for kind in ("env", "warmup", "train")}
    assert len(shown["warmup"]) == 2  # per_gpu: drafter = [2, 3], one run each
    p = cli(["submit", str(spec), "--job-id", job_id, "--follow"], env, timeout=180)
    assert p.returncode == 0, p.stderr.decode()[-2000:]
    ev = events(tmp_path / "root" / "jobs" / job_id)
    ran_env = [e["argv"] for e in ev if e["type"] == "prepare"]
    ran_warmup = [e for e in ev if e["type"] == "phase" and e["phase"] == "warmup"]
    ran_train = [e["argv"] for e in ev if e["type"] == "phase" and e["phase"] == "train"]
    # the venv build (everything but the verify step, which the supervisor runs captured)
    build = [a for a in shown["env"] if "<verify" not in " ".join(a)]
    assert len(build) == len(ran_env) and all(map(same_command, build, ran_env)), (build, ran_env)
    # the warmup: the same GPUs in the same order, each with the command the plan shows
    assert [e["gpu"] for e in ran_warmup] == [2, 3]
    assert [e["argv"] for e in ran_warmup] == shown["warmup"]
    assert ran_train == shown["train"]
    assert f"ck-{job_id}.json" in " ".join(ran_train[0])  # the placeholders were substituted alike
    assert "gpu 3 of 2,3" in " ".join(ran_warmup[1]["argv"])
    # and each warmup run saw its one GPU (the fan-out's environment)
    log = (tmp_path / "root" / "jobs" / job_id / "warmup.log").read_text()
    assert "warmup on GPU 2: done" in log and "warmup on GPU 3: done" in log
