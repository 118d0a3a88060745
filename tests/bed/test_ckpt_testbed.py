"""Checkpoints on the loopback Proxmox bed (issue 33 item 3, issue 35 row 1): a trainer that
renames its checkpoint into place every ~2 s is rolled back with its last save resumed and
stopped without a torn file; a checkpoint directory linked by the command to a data directory
holding others' files: gc deletes only what this job wrote."""

from __future__ import annotations

import json

import pytest
import yaml

from helpers import cli, cli_json, job_id_of, wait_for, write_spec
from test_jobs_testbed import bed_env, home_path  # noqa: F401 (a fixture)

pytestmark = pytest.mark.testbed


def events(testbed, env, job_id) -> list:
    path = home_path(testbed, env, "jobs", job_id, "events.jsonl")
    return [json.loads(ln) for ln in path.read_text().splitlines() if ln.strip()] if path.exists() else []


def test_a_trainer_saving_every_2s_is_rolled_back_from_its_last_save_and_stopped(testbed, bed_env, tmp_path,
                                                                                 index):
    env = bed_env
    spec = write_spec(tmp_path / "job.yaml", target="ct200", fast_url=index["fast"], slow_url=index["slow"],
                      profile="fast", warmup=False, throughput=False,
                      trainer_args="--steps 100000 --interval 0.1 --checkpoint-every 20")
    data = yaml.safe_load(spec.read_text())
    data["train"]["checkpoint"] = {"path": "checkpoint.json", "every": "2s", "settle": "5s"}
    spec.write_text(yaml.safe_dump(data))
    job_id = job_id_of(cli(["submit", str(spec)], env, check=True, timeout=300).stdout)
    wait_for(lambda: sum(e["type"] == "checkpoint_finished" for e in events(testbed, env, job_id)) >= 2, 240,
             what="two finished saves")
    cli(["rollback", job_id, "--to", "slow"], env, check=True, timeout=120)
    wait_for(lambda: any(e["type"] == "resume_point" for e in events(testbed, env, job_id)), 240,
             what="the resume")
    [point] = [e for e in events(testbed, env, job_id) if e["type"] == "resume_point"]
    assert point["file"] and point["file"].endswith("checkpoint.json"), point
    log = home_path(testbed, env, "jobs", job_id, "train.log")
    wait_for(lambda: "resumed from checkpoint at step" in log.read_text(), 240, what="the trainer's resume")
    step = int(log.read_text().split("resumed from checkpoint at step ")[1].split()[0])
    assert step >= 20 and step % 20 == 0
    assert cli(["stop", job_id], env, timeout=120).returncode == 0
    ev = events(testbed, env, job_id)
    assert not [e for e in ev if e["type"] == "checkpoint_torn"]
    assert not [e for e in ev if e["type"] == "save_waited" and not e["finished"]]
    assert cli_json(["status", job_id, "--json"], env)["state"] == "stopped"


def test_a_link_made_by_the_command_to_a_data_dir_never_lets_gc_delete_others_files(
        testbed, bed_env, tmp_path, index):
    env = bed_env
    data_dir = f"{env['GPUJOB_TEST_HOME']}-data/run"
    testbed.container_exec("mkdir", "-p", f"{data_dir}/checkpoint-700")
    testbed.container_exec("sh", "-c", f"echo theirs > {data_dir}/checkpoint-700/model.bin; "
                           f"echo mine > {data_dir}/precious.txt; touch -d '1 hour ago' {data_dir}/* "
                           f"{data_dir}/checkpoint-700/model.bin")
    try:
        spec = write_spec(tmp_path / "job.yaml", target="ct200", fast_url=index["fast"],
                          slow_url=index["slow"], profile="fast", warmup=False, throughput=False,
                          trainer_args="--steps 8 --interval 0.05 --checkpoint-dir ckpt --checkpoint-every 2")
        data = yaml.safe_load(spec.read_text())
        data["train"]["command"] = f"ln -sfn {data_dir} ckpt && {data['train']['command']}"
        data["train"]["checkpoint"] = {"path": "ckpt/*", "every": "1s", "settle": "0.3s"}
        spec.write_text(yaml.safe_dump(data))
        p = cli(["submit", str(spec), "--follow"], env, timeout=300)
        assert p.returncode == 0, p.stdout.decode()[-3000:]
        res = cli_json(["gc", "ct200", "--keep-checkpoints", "0", "--json"], env)
        removed = sorted(c["path"].rsplit("/", 1)[1] for c in res["checkpoints"] if c["removed"])
        assert removed == ["checkpoint-2", "checkpoint-4", "checkpoint-6", "checkpoint-8"], res
        left = sorted(p.name for p in testbed.container_path(data_dir).iterdir())
        assert left == ["checkpoint-700", "precious.txt"]
        assert testbed.container_path(f"{data_dir}/checkpoint-700/model.bin").read_text() == "theirs\n"
    finally:
        testbed.container_exec("rm", "-rf", f"{env['GPUJOB_TEST_HOME']}-data")
