"""Issue 10 end to end on the local target (real CLI, agent, supervisor, venv): a
hostile workdir substituted into the train command, secrets from the laptop's
environment and from a file, a setuid file in the synced code."""

from __future__ import annotations

import json
import os
import stat

import pytest
import yaml

from gpujob.ops.wheelhouse import build_indexes
from helpers import cli, job_id_of, local_env

TOKEN = "hf_sekret-TOKEN-1234567890"
FILE_TOKEN = "file-sekret-0987654321"

TRAIN = ("printf '%s' {workdir} > wd.txt; printf '%s' \"$GPUJOB_WORKDIR\" > env_wd.txt; "
         "printf '%s' \"$HF_TOKEN\" > tok.txt; printf '%s' \"$FILE_TOK\" > ftok.txt; printf '%s' \"$PLAIN\" "
         "> plain.txt; stat -c %a code/run.sh > mode.txt; "
         "stat -c %a \"$GPUJOB_HOME/jobs/$GPUJOB_JOB_ID/secrets.json\" > smode.txt; echo '[/bold] [rank0]: "
         "done'")


@pytest.fixture(scope="module")
def fast_url(tmp_path_factory):
    return build_indexes(tmp_path_factory.mktemp("wheelhouse"))["fast"].as_uri()


def test_hostile_workdir_secrets_and_setuid(tmp_path, fast_url):
    env = local_env(tmp_path)
    pwned = tmp_path / "pwned"
    workdir = str(tmp_path / f"w a;touch {pwned};#")
    code = tmp_path / "code"
    code.mkdir()
    (code / "run.sh").write_text("#!/bin/sh\n")
    os.chmod(code / "run.sh", 0o4755)
    (tmp_path / "tok.txt").write_text(FILE_TOKEN + "\n")
    spec = tmp_path / "job.yaml"
    spec.write_text(yaml.safe_dump({
        "name": "hostile", "target": "box", "workdir": workdir,
        "sync": [{"src": "code", "dest": "code"}],
        "env": {"HF_TOKEN": {"from_env": "GJ_TEST_TOKEN"}, "PLAIN": "plain value"},
        "profiles": [{"name": "fast", "index_url": fast_url, "packages": ["gpujob-demo-kernels==1.0.0+fast"],
                      "env": {"FILE_TOK": {"from_file": "tok.txt"}}}],
        "train": {"command": TRAIN},
    }, sort_keys=False, width=10**6))
    line = spec.read_text().splitlines().index("  HF_TOKEN:") + 1
    # no token in this shell: the plan refuses, pointing at the line, and runs nothing
    p = cli(["submit", str(spec), "--plan"], env)
    assert p.returncode == 2
    assert p.stderr.decode().startswith(f"gpujob: {spec}:{line}: env.HF_TOKEN: from_env: $GJ_TEST_TOKEN is "
                                        f"not set")
    env["GJ_TEST_TOKEN"] = TOKEN
    p = cli(["submit", str(spec), "--plan"], env, check=True)
    plan = p.stdout.decode()
    assert "HF_TOKEN=*** (from $GJ_TEST_TOKEN)" in plan and "FILE_TOK=*** (from tok.txt)" in plan
    assert f"-> {workdir}/code" in plan  # the resolved destination
    assert TOKEN not in plan and FILE_TOKEN not in plan

    p = cli(["submit", str(spec), "--follow"], env, timeout=300)
    out = p.stdout.decode() + p.stderr.decode()
    assert p.returncode == 0, out
    assert TOKEN not in out and FILE_TOKEN not in out
    assert "[/bold] [rank0]: done" in out  # trainer output, shown as written

    wd = tmp_path / f"w a;touch {pwned};#"
    assert (wd / "wd.txt").read_text() == workdir == (wd / "env_wd.txt").read_text()
    assert not pwned.exists()
    assert (wd / "tok.txt").read_text() == TOKEN and (wd / "ftok.txt").read_text() == FILE_TOKEN
    assert (wd / "plain.txt").read_text() == "plain value"
    assert (wd / "mode.txt").read_text().strip() == "755"  # no setuid in the container
    assert (wd / "smode.txt").read_text().strip() == "600"  # the secrets file while the job ran
    assert stat.S_IMODE(os.stat(wd / "code" / "run.sh").st_mode) == 0o755

    job_dir = tmp_path / "root" / "jobs" / job_id_of(p.stdout)
    assert not (job_dir / "secrets.json").exists()  # removed when the job ended
    job = json.loads((job_dir / "job.json").read_text())
    assert job["spec"]["env"]["HF_TOKEN"] == "***" and job["spec"]["profiles"][0]["env"]["FILE_TOK"] == "***"
    assert sorted(job["secret_names"]) == ["FILE_TOK", "HF_TOKEN"] and "secrets" not in job
    for path in job_dir.rglob("*"):
        if path.is_file():
            data = path.read_bytes()
            assert TOKEN.encode() not in data and FILE_TOKEN.encode() not in data, path
    st = cli(["status", job_id_of(p.stdout), "--json"], env, check=True).stdout.decode()
    assert TOKEN not in st and json.loads(st)["state"] == "succeeded"
