"""`gpujob bisect` / `tune` at the door, on the local target: bad input is one line and exit 2
with nothing started; `--plan` shows the difference and what each trial runs, and runs
nothing. The trials themselves run on the bed (tests/bed/test_bisect_bed.py)."""

from __future__ import annotations

import pytest
import yaml

from clirun import cli
from helpers import local_env
from test_cli import one_line_error


@pytest.fixture
def env(tmp_path):
    return local_env(tmp_path)


def spec(tmp_path, **extra):
    data = {
        "name": "bis", "target": "box",
        "sync": [{"src": str(tmp_path), "dest": "."}],
        "profiles": [
            {"name": "old", "index_url": "https://idx.example/simple",
             "packages": ["torch==2.10.0", "triton==3.5.1", "numpy==2.1.0"]},
            {"name": "new", "index_url": "https://idx.example/simple", "env": {"TORCHDYNAMO_DISABLE": "1"},
             "packages": ["torch==2.11.0", "triton==3.6.0", "numpy==2.1.0"]},
            {"name": "same", "index_url": "https://idx.example/simple",
             "packages": ["torch==2.10.0", "triton==3.5.1", "numpy==2.1.0"]},
        ],
        "train": {"command": "python train.py --out out"},
        "throughput": {"format": "ktok", "min": "1K"},
    }
    data.update(extra)
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def test_plan_shows_the_changes_and_each_trials_steps_and_runs_nothing(tmp_path, env):
    p = cli(["bisect", str(spec(tmp_path)), "--good", "old", "--bad", "new", "--plan", "--together",
             "torch,triton", "--trial-time", "3m"], env, check=True)
    text = p.stdout.decode()
    assert "bisect old -> new: 2 changes; one culprit takes at most 3 trials" in text, text
    assert "1. torch 2.10.0 -> 2.11.0 (moves with triton 3.5.1 -> 3.6.0)" in text
    assert "2. env TORCHDYNAMO_DISABLE (none) -> 1" in text
    assert "trial 1 (the good profile): job bis-bisect-xxxx, profile old" in text
    assert "work/bis-bisect (its own; rollback off" in text
    assert "torch==2.10.0" in text and "python train.py --out out" in text
    assert "at most 180s" in text
    assert not (tmp_path / "root").exists()  # nothing ran, nothing was made on the target


def test_tune_plan_lists_each_profile(tmp_path, env):
    p = cli(["tune", str(spec(tmp_path)), "-p", "old", "-p", "new", "--plan"], env, check=True)
    text = p.stdout.decode()
    assert "trial 1 (old)" in text and "trial 2 (new)" in text and "torch==2.11.0" in text
    assert not (tmp_path / "root").exists()


@pytest.mark.parametrize("args, expect", [
    (["bisect", "{spec}", "--good", "nope", "--bad", "new", "--plan"], "--good: profile 'nope' is not in"),
    (["bisect", "{spec}", "--good", "old", "--bad", "old", "--plan"],
     "--good and --bad are the same profile"),
    (["bisect", "{spec}", "--good", "old", "--bad", "same"],
     "hold the same packages and env: nothing to bisect"),
    (["bisect", "{spec}", "--good", "old", "--bad", "same", "--plan"], "nothing to bisect"),
    (["bisect", "{spec}", "--good", "old", "--bad", "new", "--trial-time", "soon"],
     "--trial-time: expected a duration"),
    (["bisect", "{spec}"], "--good: the ledger of bis on lab/box has no known-good profile"),
    (["tune", "{spec}", "-p", "old"], "--profile: name two profiles or more"),
    (["tune", "{spec}", "-p", "old", "-p", "x\x1b[31m"], "--profile: 'x\\x1b[31m' is not in"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, env, args, expect):
    path = spec(tmp_path)
    p = cli([a.replace("{spec}", str(path)) for a in args], env)
    assert p.returncode == 2, p.stderr.decode()
    assert expect in one_line_error(p)
    assert not (tmp_path / "root" / "jobs").exists()  # no trial started


def test_a_sync_outside_the_workdir_is_refused(tmp_path, env):
    path = spec(tmp_path, sync=[{"src": str(tmp_path), "dest": "/srv/code"}])
    p = cli(["bisect", str(path), "--good", "old", "--bad", "new", "--plan"], env)
    assert p.returncode == 2 and "sync[0].dest: '/srv/code' is outside the workdir" in one_line_error(p)


def test_no_throughput_section_is_refused(tmp_path, env):
    path = spec(tmp_path)
    data = yaml.safe_load(path.read_text())
    del data["throughput"]
    path.write_text(yaml.safe_dump(data))
    p = cli(["tune", str(path), "-p", "old", "-p", "new"], env)
    assert p.returncode == 2 and "throughput: missing" in one_line_error(p)
