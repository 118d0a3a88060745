"""`gpujob tune --from JOB` on a trainer that resumes from a fixed place by itself (nanoGPT's
`--init_from=resume` from OUT/{job_id}/ckpt.pt): each trial's start is copied once, at submit,
straight into the trial's own place; the supervisor finds it there and copies nothing (before: a
copy into the trial's workdir at the job's place, then a second one into the trial's own). Local
kind, the real CLI, a stdlib trainer."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from helpers import cli, events, job_id_of, local_env

TRAINER = '''import json, os, sys, time
d, steps, rate = sys.argv[1], int(sys.argv[2]), float(os.environ["FX_RATE"])
start = 0
if "--resume" in sys.argv[3:]:
    with open(os.path.join(d, "ckpt.json")) as f:
        start = json.load(f)["step"]
    print(f"resumed at step {start}", flush=True)
os.makedirs(d, exist_ok=True)
for step in range(start + 1, steps + 1):
    time.sleep(0.05)
    print(f"step {step} | {rate / 1000:.1f}K tok/s", flush=True)
    if step % 10 == 0:
        with open(os.path.join(d, ".ckpt.tmp"), "w") as f:
            json.dump({"step": step}, f)
        os.replace(os.path.join(d, ".ckpt.tmp"), os.path.join(d, "ckpt.json"))
'''


def spec_file(tmp_path: Path, steps: int) -> Path:
    src = tmp_path / "src"
    src.mkdir(exist_ok=True)
    (src / "fx.py").write_text(TRAINER)
    path = tmp_path / "fx.yaml"
    path.write_text(yaml.safe_dump({
        "name": "fx", "target": "lab/box", "sync": [{"src": str(src), "dest": "."}],
        "profiles": [{"name": "quick", "system_site_packages": True, "env": {"FX_RATE": "20000"}},
                     {"name": "slow", "system_site_packages": True, "env": {"FX_RATE": "5000"}}],
        "profile": "quick",
        "train": {"command": f"python fx.py out/{{job_id}} {steps}", "resume_args": ["--resume"],
                  "checkpoint": {"path": "out/{job_id}/ckpt.json", "every": "20s", "settle": "0.5s"}},
        "throughput": {"format": "ktok", "min": "1K", "window": 3, "initial_delay": "0s"}},
        sort_keys=False))
    return path


def test_tune_from_a_job_copies_each_trials_start_once_into_its_own_place(tmp_path):
    env = local_env(tmp_path)
    p = cli(["submit", str(spec_file(tmp_path, 25)), "--follow"], env, timeout=180)
    assert p.returncode == 0, p.stdout.decode()[-3000:] + p.stderr.decode()[-2000:]
    a = job_id_of(p.stdout)
    a_ck = tmp_path / "root" / "work" / "fx" / "out" / a / "ckpt.json"
    assert json.loads(a_ck.read_text())["step"] == 20
    spec = spec_file(tmp_path, 400)  # the trials train on until tune has their rates
    t = cli(["tune", str(spec), "-p", "quick", "-p", "slow", "--from", a, "--trial-time", "6s", "--json"],
            env, timeout=300)
    assert t.returncode == 0, t.stdout.decode()[-3000:] + t.stderr.decode()[-2000:]
    trials = [d for d in (tmp_path / "root" / "jobs").iterdir() if d.name != a]
    assert len(trials) == 2, [d.name for d in trials]
    for d in trials:
        trial = d.name
        log = (d / "train.log").read_text()
        assert "resumed at step 20" in log, log[-1500:]
        ev = events(d)
        assert not [e for e in ev if e["type"] in ("start_copy", "start_copied")]  # nothing copied twice
        [point] = [e for e in ev if e["type"] == "resume_point"]
        assert point["file"].endswith(f"/out/{trial}/ckpt.json") and point["copied_from"] == str(a_ck)
        wd = Path(point["file"]).parents[2]  # the trial's workdir (its own name's)
        assert wd != a_ck.parents[2]
        assert sorted(p.name for p in (wd / "out").iterdir()) == sorted(x.name for x in trials)
        assert not (wd / "out" / a).exists()  # no copy at the job's place in the trial's workdir
    assert json.loads(a_ck.read_text())["step"] == 20  # the job's own file: read, never written
