"""`warmup.scratch` (issue 38's HF follow-up): a folder the warmup writes into, emptied
before each warmup run. The warmup here behaves as HF's example scripts of transformers
4.x do: it refuses to start on a non-empty output folder without a checkpoint-N, and
leaves its saved model there. Two warmup runs in one job (one per drafter GPU) and a
second job's warmup all start. A link planted at the folder's place is removed as a link
(what it points to is untouched); a supervisor killed between moving the folder aside and
removing it leaves nothing behind once the job runs again. Through the installed entry
point on the local kind."""

from __future__ import annotations

import os

import yaml

from helpers import cli, events, job_id_of, local_env, wait_for, write_spec
from test_faults import state_of, wheelhouse  # noqa: F401 (a fixture)
from test_jobs_local import trainers_of

HF4 = ('if [ -n "$(ls -A gpujob-warmup 2>/dev/null)" ]; then echo "ValueError: Output directory '
       '(gpujob-warmup) already exists and is not empty. Use --overwrite_output_dir to overcome." >&2; '
       'exit 1; fi; mkdir -p gpujob-warmup && echo weights > gpujob-warmup/model.safetensors')


def spec_for(tmp_path, wheelhouse, scratch: bool = True):  # noqa: F811 (the fixture's value)
    urls = wheelhouse[1]
    spec = write_spec(tmp_path / "job.yaml", target="box", fast_url=urls["fast"], slow_url=urls["slow"],
                      profile="fast", throughput=False, trainer_args="--steps 1 --interval 0.01")
    data = yaml.safe_load(spec.read_text())
    data["warmup"] = {"command": HF4, "when": "always", "per_gpu": "drafter"}
    if scratch:
        data["warmup"]["scratch"] = "{workdir}/gpujob-warmup"
    spec.write_text(yaml.safe_dump(data))
    return spec


def workdir(tmp_path):
    return tmp_path / "root" / "work" / "tjob"


def test_each_warmup_run_starts_on_an_empty_scratch_folder(tmp_path, wheelhouse):
    env = local_env(tmp_path)
    spec = spec_for(tmp_path, wheelhouse)
    plan = cli(["submit", str(spec), "--plan"], env, check=True).stdout.decode()
    assert "gpujob-warmup emptied first (warmup.scratch)" in plan
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "keep.txt").write_text("not the warmup's")
    workdir(tmp_path).mkdir(parents=True)
    os.symlink(outside, workdir(tmp_path) / "gpujob-warmup")  # planted: never followed
    for _ in range(2):  # two jobs, each with two warmup runs into the same folder
        p = cli(["submit", str(spec), "--follow"], env, timeout=180)
        assert p.returncode == 0, p.stdout.decode()[-2000:] + p.stderr.decode()[-2000:]
        job = job_id_of(p.stdout)
        assert state_of(tmp_path, job)["state"] == "succeeded"
        emptied = [e for e in events(tmp_path / "root" / "jobs" / job) if e["type"] == "scratch_emptied"]
        assert len(emptied) == 2, emptied
        assert "emptied its scratch folder" in (tmp_path / "root" / "jobs" / job / "job.log").read_text()
    assert (outside / "keep.txt").read_text() == "not the warmup's"
    assert not (workdir(tmp_path) / "gpujob-warmup").is_symlink()
    assert (workdir(tmp_path) / "gpujob-warmup" / "model.safetensors").exists()  # the last run's output


def test_without_scratch_the_second_warmup_run_refuses(tmp_path, wheelhouse):
    """The same job without the key: the second drafter's warmup finds the first's model
    and refuses, as a 4.x example script does (what the recipe's key is for)."""
    env = local_env(tmp_path)
    spec = spec_for(tmp_path, wheelhouse, scratch=False)
    p = cli(["submit", str(spec), "--follow"], env, timeout=180)
    assert p.returncode != 0
    job = job_id_of(p.stdout)
    assert state_of(tmp_path, job)["state"] == "failed"
    assert "already exists and is not empty" in (tmp_path / "root" / "jobs" / job / "warmup.log").read_text()


def test_a_supervisor_killed_mid_emptying_leaves_nothing_behind(tmp_path, wheelhouse):
    env = local_env(tmp_path)
    spec = spec_for(tmp_path, wheelhouse)
    (workdir(tmp_path) / "gpujob-warmup").mkdir(parents=True)
    (workdir(tmp_path) / "gpujob-warmup" / "model.safetensors").write_text("an earlier warmup's")
    died = tmp_path / "died"
    job = job_id_of(cli(["submit", str(spec)], dict(env, GPUJOB_TEST_DIE_AT=f"scratch_moved@{died}"),
                        check=True).stdout)
    wait_for(died.exists, 90, what="the supervisor to die with the folder moved aside")
    sup = state_of(tmp_path, job)["supervisor_pid"]
    wait_for(lambda: not os.path.exists(f"/proc/{sup}/status")
             or "State:\tZ" in open(f"/proc/{sup}/status").read(), 10, what="the supervisor gone")
    names = os.listdir(workdir(tmp_path))
    assert "gpujob-warmup" not in names  # moved aside whole: never half emptied at its place
    assert [n for n in names if n.startswith(".gpujob-scratch-trash-")]
    p = cli(["stop", job], env)
    assert p.returncode == 0, p.stderr.decode()
    wait_for(lambda: not trainers_of(tmp_path), 20, what="nothing of the job left running")
    p = cli(["submit", str(spec), "--follow"], env, timeout=180)
    assert p.returncode == 0, p.stdout.decode()[-2000:] + p.stderr.decode()[-2000:]
    assert not [n for n in os.listdir(workdir(tmp_path)) if n.startswith(".gpujob-scratch-trash-")]
