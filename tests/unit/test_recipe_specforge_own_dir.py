"""SpecForge's recipe gives each job an output_dir of its own (issue 38 item 3: no other job's
checkpoint, ever). SpecForge 0.2.0's save of step N first deletes every {run_id}-stepM with
M >= N in its output_dir (and its rotation the oldest there beyond max_checkpoints): a fresh
job of the same output_dir and run_id deleted an earlier job's checkpoints at its first save,
while submit says they stay as they are.

Each case builds the argv the supervisor runs (the spec loaded as `submit` loads it, its
command and resume_args filled in as the supervisor fills them) and reads it the way
SpecForge's CLI reads its `key=value` overrides (the last one wins)."""

from __future__ import annotations

import shlex
from pathlib import Path

import yaml

from gpujob.agent.base.placeholders import command_argv, substitute
from gpujob.spec.model import load_spec

BASE = {"name": "j", "target": "box", "profiles": [{"name": "base", "system_site_packages": True}],
        "throughput": {"min_ratio": 0.8, "tokens_per_step": 64}}
CMD = "python -m specforge.cli train -c run.yaml output_dir={workdir}/outputs run_id=dflash"


def job(tmp_path: Path, command, **train) -> dict:
    data = {**BASE, "recipe": "specforge", "train": {"command": command, **train}}
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return load_spec(path).to_agent_dict()


def argv_of(spec: dict, job_id: str, workdir: Path, resume_from: str | None = None) -> list:
    extra = [substitute(a, {"resume_from": resume_from}) for a in spec["train"]["resume_args"]] \
        if resume_from else []
    cmd = command_argv(spec["train"]["command"], {"job_id": job_id, "workdir": str(workdir)}, extra)
    return shlex.split(cmd[2]) if cmd[1] == "-c" else cmd


def override(argv: list, key: str) -> str | None:
    found = None
    for a in argv:
        if a.startswith(key + "="):
            found = a[len(key) + 1:]
    return found


def save(argv: list, step: int) -> Path:
    """What SpecForge 0.2.0's CheckpointManager.save(step) does on disk (one rank)."""
    out, run_id = Path(override(argv, "output_dir") or "output"), override(argv, "run_id") or "specforge-run"
    out.mkdir(parents=True, exist_ok=True)
    for p in out.glob(f"{run_id}-step*"):
        if p.name[len(run_id) + 5:].isdigit() and int(p.name[len(run_id) + 5:]) >= step:
            for f in p.iterdir():
                f.unlink()
            p.rmdir()
    d = out / f"{run_id}-step{step}"
    d.mkdir()
    (d / "training_state.pt").write_text(str(step))
    return d


def test_a_fresh_job_of_the_same_spec_deletes_none_of_an_earlier_jobs_checkpoints(tmp_path):
    spec = job(tmp_path, CMD)
    first = [save(argv_of(spec, "j-aaaa", tmp_path), s) for s in (100, 200)]
    save(argv_of(spec, "j-bbbb", tmp_path), 100)  # the second job's first save
    assert all((d / "training_state.pt").is_file() for d in first), "an earlier job's checkpoint went"
    # and the register looks where the trainer writes: each job's own
    assert spec["train"]["checkpoint"]["path"] == "outputs/{job_id}/dflash-step*"
    assert override(argv_of(spec, "j-aaaa", tmp_path), "output_dir") == f"{tmp_path}/outputs/j-aaaa"


def test_a_resume_from_another_job_names_that_jobs_directory_and_saves_into_its_own(tmp_path):
    spec = job(tmp_path, CMD)
    theirs = save(argv_of(spec, "j-aaaa", tmp_path), 100)
    argv = argv_of(spec, "j-bbbb", tmp_path, resume_from=str(theirs))
    assert override(argv, "training.resume_from") == str(theirs)
    assert override(argv, "output_dir") == f"{tmp_path}/outputs/j-bbbb"
    save(argv, 100)  # the resumed job's save of the same step leaves theirs
    assert (theirs / "training_state.pt").is_file()


def test_the_warmup_keeps_its_own_dir_and_no_job_id(tmp_path):
    spec = job(tmp_path, CMD)
    warm = spec["warmup"]["command"]
    assert "{job_id}" not in warm and override(warm.split(), "output_dir") == "{workdir}/gpujob-warmup"


def test_a_command_without_output_dir_a_list_and_a_dir_that_needs_quotes(tmp_path):
    spec = job(tmp_path, "python -m specforge.cli train -c run.yaml run_id=r")
    assert spec["train"]["checkpoint"]["path"] == "output/{job_id}/r-step*"
    assert override(argv_of(spec, "j-aaaa", tmp_path), "output_dir") == "output/j-aaaa"
    spec = job(tmp_path, ["python", "-m", "specforge.cli", "train", "output_dir=o", "run_id=r"])
    assert override(argv_of(spec, "j-aaaa", tmp_path), "output_dir") == "o/j-aaaa"
    spec = job(tmp_path, "python -m specforge.cli train 'output_dir=my runs' run_id=r")
    assert override(argv_of(spec, "j-aaaa", tmp_path), "output_dir") == "my runs/j-aaaa"


def test_left_alone_a_dir_with_job_id_and_a_specs_own_checkpoint(tmp_path):
    own = "python -m specforge.cli train output_dir={workdir}/o/{job_id} run_id=r"
    spec = job(tmp_path, own)
    assert spec["train"]["command"] == own + " training.log_interval=10"
    assert spec["train"]["checkpoint"]["path"] == "o/{job_id}/r-step*"
    spec = job(tmp_path, CMD, checkpoint={"path": "outputs/dflash-step*", "every": "15m",
                                          "done_file": "training_state.pt"})
    assert "{job_id}" not in spec["train"]["command"]
