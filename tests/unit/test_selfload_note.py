"""The job log's note on checkpoints earlier jobs left (the supervisor's, at a run's start)
says what the trainer will do with them, as submit's note does (issue 34, issue 38 row 3):
a trainer that loads one by itself (HF's example scripts in a shared --output_dir) is named,
not hidden behind "this job never resumes from them". The submit request carries the phrase
(spec/selfload.py, on the laptop) to the supervisor (stdlib only)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import yaml

from gpujob.agent.supervisor.cksupervise import Checkpoints
from gpujob.ops.plan import job_request
from gpujob.spec.model import load_spec

HF = "python run_clm.py --per_device_train_batch_size 2 --max_seq_length 64"


class _Journal:
    def __init__(self):
        self.events = []

    def event(self, kind, **kw):
        self.events.append(dict(kw, type=kind))

    def set_state(self, **kw):
        pass


def _spec(tmp_path: Path, command: str, **train):
    data = {"name": "j", "target": "box", "profiles": [{"name": "base", "system_site_packages": True}],
            "recipe": "hf_trainer", "train": {"command": command, **train}, "throughput": {"min_ratio": 0.8}}
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return load_spec(path)


def _first_run_says(tmp_path: Path, spec, job_id: str) -> list:
    """Start the first run's checkpoint watch of job ``job_id`` as the supervisor does, with
    job.json as submit writes it from the request, and an earlier job's checkpoint-100 left in out/."""
    req = job_request(spec, job_id, "base", clear_caches=False)
    work = tmp_path / "work"
    (work / "out" / "checkpoint-100").mkdir(parents=True, exist_ok=True)
    (work / "out" / "checkpoint-100" / "trainer_state.json").write_text("{}")
    said = []
    job = SimpleNamespace(spec=req.spec, job=req.job_record(), job_id=job_id, workdir=str(work),
                          home=SimpleNamespace(root=str(tmp_path / "home")))
    child_env = SimpleNamespace(values=lambda profile: {"job_id": job_id, "workdir": str(work)})
    ck = Checkpoints(job, _Journal(), runner=None, child_env=child_env,
                     report=SimpleNamespace(say=said.append))
    ck.checkpoint_watch("base", None)
    return said


def test_a_shared_output_dir_is_named_in_the_job_log(tmp_path):
    spec = _spec(tmp_path, HF, checkpoint={"path": "out/checkpoint-*", "every": "10m"})  # its own: out/ stays
    [line] = _first_run_says(tmp_path, spec, "j-2")
    assert "were left by earlier jobs" in line and "never resumes" not in line
    assert "gpujob never passes them to this job, but HF's example scripts" in line


def test_a_job_of_its_own_output_dir_finds_none_of_them(tmp_path):
    spec = _spec(tmp_path, HF + " --output_dir out")  # the recipe's out/{job_id}
    assert _first_run_says(tmp_path, spec, "j-3") == []
