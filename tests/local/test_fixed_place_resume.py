"""`submit --resume-from JOB` for any trainer that resumes from a fixed place, not only nanoGPT's
(issue 38 row 4, item 3): a hand-written spec, no recipe, whose trainer reloads the directory
ckpt/{job_id}/latest on `--resume` (resume_args without {resume_from}; a checkpoint path that is no
glob). The supervisor copies JOB's directory into this job's place before the trainer starts.
Local kind."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from helpers import cli, events, job_id_of, local_env

TRAINER = '''import os, shutil, sys, time
d, steps = sys.argv[1], int(sys.argv[2])
start = 0
if "--resume" in sys.argv[3:]:
    with open(os.path.join(d, "latest", "step")) as f:
        start = int(f.read())
    print(f"resumed at step {start}", flush=True)
for step in range(start + 1, steps + 1):
    time.sleep(0.05)
    print(f"step {step}", flush=True)
    if step % 10 == 0:  # the whole directory built beside, then renamed in
        tmp = os.path.join(d, ".next")
        shutil.rmtree(tmp, ignore_errors=True)
        os.makedirs(tmp)
        for name, text in (("weights", "w" * 1000), ("step", str(step))):
            with open(os.path.join(tmp, name), "w") as f:
                f.write(text)
        shutil.rmtree(os.path.join(d, "latest"), ignore_errors=True)
        os.replace(tmp, os.path.join(d, "latest"))
'''


def spec_file(tmp_path: Path, steps: int) -> Path:
    src = tmp_path / "src"
    src.mkdir(exist_ok=True)
    (src / "fx.py").write_text(TRAINER)
    path = tmp_path / f"fx-{steps}.yaml"
    path.write_text(yaml.safe_dump({
        "name": "fx", "target": "box", "sync": [{"src": str(src), "dest": "."}],
        "profiles": [{"name": "p", "system_site_packages": True}],
        "train": {"command": f"python fx.py ckpt/{{job_id}} {steps}", "resume_args": ["--resume"],
                  "checkpoint": {"path": "ckpt/{job_id}/latest", "every": "20s", "settle": "1s"}},
        "throughput": None}, sort_keys=False))
    return path


def submit(tmp_path: Path, env: dict, steps: int, *more: str) -> str:
    p = cli(["submit", str(spec_file(tmp_path, steps)), "--follow", *more], env, timeout=180)
    assert p.returncode == 0, p.stdout.decode()[-3000:] + p.stderr.decode()[-2000:]
    return job_id_of(p.stdout)


def test_resume_from_a_job_copies_its_checkpoint_directory_into_this_jobs_fixed_place(tmp_path):
    env = local_env(tmp_path)
    a = submit(tmp_path, env, 25)  # its latest: step 20
    b = submit(tmp_path, env, 45)  # step 40, in its own place
    ck = tmp_path / "root" / "work" / "fx" / "ckpt"
    assert (ck / a / "latest" / "step").read_text() == "20"
    assert (ck / b / "latest" / "step").read_text() == "40"
    c = submit(tmp_path, env, 28, "--resume-from", a)  # 21..28: no save of its own
    log = (tmp_path / "root" / "jobs" / c / "train.log").read_text()
    assert "resumed at step 20" in log, log[-2000:]
    assert sorted(p.name for p in (ck / c / "latest").iterdir()) == ["step", "weights"]
    assert sorted(p.name for p in (ck / c).iterdir()) == ["latest"]  # no temp copy left beside
    [point] = [e for e in events(tmp_path / "root" / "jobs" / c) if e["type"] == "resume_point"]
    assert point["copied_from"] == str(ck / a / "latest") and point["file"] == str(ck / c / "latest")
    reg = json.loads((tmp_path / "root" / "checkpoints" / f"{c}.json").read_text())
    assert reg["files"] == {}  # the copy is not a checkpoint C wrote
    assert (ck / a / "latest" / "step").read_text() == "20"
