"""What a fresh and a resumed trainer get from the hf_trainer and torchtitan recipes (issues 34
and 38: no other job's checkpoint, ever; `submit --resume-from JOB` reaches the trainer).

Each case builds the argv the supervisor runs (the spec loaded as `submit` loads it, its
command and resume_args filled in as agent/supervisor/phases.py fills them) and reads it
the way the trainer reads its own arguments (the last of a flag wins, as in argparse and
tyro): HF's example scripts of transformers 4.x take the newest checkpoint-N of
--output_dir unless --resume_from_checkpoint names one; torchtitan 0.2.2 loads
--checkpoint.initial_load_path only while its own checkpoint folder does not exist, else
the newest step-N in that folder."""

from __future__ import annotations

import os
import shlex
from pathlib import Path

import yaml

from gpujob.agent.base.placeholders import command_argv, substitute
from gpujob.spec import selfload
from gpujob.spec.model import load_spec

BASE = {"name": "j", "target": "box", "profiles": [{"name": "base", "system_site_packages": True}],
        "throughput": {"min_ratio": 0.8}}
HF = "python run_clm.py --output_dir out --per_device_train_batch_size 2 --max_seq_length 64"
TITAN = "python -m torch.distributed.run --nproc_per_node 1 -m torchtitan.train --job.config_file train.toml"


def job(tmp_path: Path, recipe: str, command, **train) -> dict:
    """job.json's spec of a spec with this recipe and command (as submit loads it)."""
    data = {**BASE, "recipe": recipe, "train": {"command": command, **train}}
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return load_spec(path).to_agent_dict()


def argv_of(spec: dict, job_id: str, workdir: Path, resume_from: str | None = None) -> list:
    """The trainer's words as the supervisor starts it (a resume: resume_args with the
    checkpoint gpujob chose), the shell string split as bash would."""
    extra = [substitute(a, {"resume_from": resume_from}) for a in spec["train"]["resume_args"]] \
        if resume_from else []
    cmd = command_argv(spec["train"]["command"], {"job_id": job_id, "workdir": str(workdir)}, extra)
    return shlex.split(cmd[2]) if cmd[1] == "-c" else cmd


def last(argv: list, *names: str):
    found = None
    for i, a in enumerate(argv):
        for n in names:
            if a == n and i + 1 < len(argv):
                found = argv[i + 1]
            elif a.startswith(n + "="):
                found = a[len(n) + 1:]
    return found


def hf_loads(argv: list, workdir: Path) -> str | None:
    """What a transformers 4.x example script (run_clm.py) loads at its start."""
    given = last(argv, "--resume_from_checkpoint")
    if given is not None:
        return given
    out = workdir / (last(argv, "--output_dir", "--output-dir") or "trainer_output")
    if "--overwrite_output_dir" in argv or not out.is_dir():
        return None
    steps = [int(p.name.split("-")[1]) for p in out.iterdir() if p.name.startswith("checkpoint-")]
    return str(out / f"checkpoint-{max(steps)}") if steps else None


def titan_loads(argv: list, workdir: Path) -> tuple:
    """(what torchtitan 0.2.2 loads at its start, whether the whole state: its step too)."""
    toggles = [a for a in argv if a in ("--checkpoint.enable", "--checkpoint.no-enable")]
    if not toggles or toggles[-1] != "--checkpoint.enable":
        return None, False
    folder = workdir / (last(argv, "--job.dump_folder") or "outputs") / (last(argv, "--checkpoint.folder")
                                                                        or "checkpoint")
    if not folder.exists():
        initial = last(argv, "--checkpoint.initial_load_path")
        whole = [a for a in argv if a.endswith("initial_load_model_only")]
        whole_state = bool(whole) and whole[-1] == "--checkpoint.no_initial_load_model_only"
        return initial, initial is not None and whole_state
    steps = [int(p.name.split("-")[1]) for p in folder.iterdir() if (p / ".metadata").exists()]
    return (str(folder / f"step-{max(steps)}") if steps else None), True


def saved(path: Path, done: str) -> str:
    path.mkdir(parents=True)
    (path / done).write_text("{}")
    return str(path)


def test_hf_a_fresh_job_never_finds_an_earlier_jobs_checkpoint(tmp_path):
    spec = job(tmp_path, "hf_trainer", HF)
    assert spec["train"]["command"] == HF + " --output_dir out/{job_id}"
    assert spec["train"]["checkpoint"]["path"] == "out/{job_id}/checkpoint-*"
    work = tmp_path / "work"
    saved(work / "out" / "j-1" / "checkpoint-100", "trainer_state.json")  # job 1's, as it left it
    fresh = argv_of(spec, "j-2", work)
    assert last(fresh, "--output_dir") == "out/j-2" and hf_loads(fresh, work) is None
    assert selfload.self_loads("hf_trainer", spec["train"]["command"]) is None  # the note: "never resumes"
    assert selfload.earlier_note("hf_trainer", spec["train"]["command"]).startswith("this job never resumes")


def test_hf_a_resume_loads_this_jobs_newest_or_the_one_submit_resume_from_named(tmp_path):
    spec = job(tmp_path, "hf_trainer", HF)
    work = tmp_path / "work"
    other = saved(work / "out" / "j-1" / "checkpoint-100", "trainer_state.json")
    # submit --resume-from j-1: job 2's first start gets j-1's checkpoint
    first = argv_of(spec, "j-2", work, resume_from=other)
    assert hf_loads(first, work) == other and last(first, "--output_dir") == "out/j-2"
    # a rollback of job 2 after it saved: its own newest
    own = saved(work / "out" / "j-2" / "checkpoint-140", "trainer_state.json")
    assert hf_loads(argv_of(spec, "j-2", work, resume_from=own), work) == own


def test_hf_a_command_that_says_where_is_left_as_it_is_and_submit_says_what_happens(tmp_path):
    mine = HF.replace("--output_dir out", "--output_dir {workdir}/runs/{job_id}")
    spec = job(tmp_path, "hf_trainer", mine)
    assert spec["train"]["command"] == mine
    assert spec["train"]["checkpoint"]["path"] == "runs/{job_id}/checkpoint-*"
    # its own checkpoint path: the recipe does not move the output dir away from it
    spec = job(tmp_path, "hf_trainer", HF, checkpoint={"path": "out/checkpoint-*", "every": "10m"})
    assert spec["train"]["command"] == HF
    note = selfload.earlier_note("hf_trainer", spec["train"]["command"])
    assert "never resumes" not in note and "--output_dir (out)" in note
    # no --output_dir: HF's default, trainer_output (shared), and the note says so
    bare = HF.replace("--output_dir out ", "")
    spec = job(tmp_path, "hf_trainer", bare)
    assert spec["train"]["command"] == bare
    assert spec["train"]["checkpoint"]["path"] == "trainer_output/checkpoint-*"
    assert "trainer_output" in selfload.earlier_note("hf_trainer", bare)


def test_hf_an_output_dir_with_a_space_stays_one_word_with_the_job_id(tmp_path):
    spec = job(tmp_path, "hf_trainer", HF.replace("--output_dir out", "--output_dir 'my out'"))
    work = tmp_path / "work"
    assert last(argv_of(spec, "j-3", work), "--output_dir") == "my out/j-3"
    spec = job(tmp_path, "hf_trainer", shlex.split(HF.replace("--output_dir out", "--output-dir=my-out/")))
    assert last(argv_of(spec, "j-3", work), "--output-dir") == "my-out/j-3"  # an argv list: its own spelling


def test_torchtitan_submit_resume_from_another_job_reaches_the_trainer(tmp_path):
    spec = job(tmp_path, "torchtitan", TITAN)
    work = tmp_path / "work"
    other = saved(work / "outputs" / "checkpoint" / "j-3" / "step-40", ".metadata")
    first = argv_of(spec, "j-4", work, resume_from=other)  # submit --resume-from j-3
    assert titan_loads(first, work) == (other, True)  # its whole state: it goes on from step 40
    assert titan_loads(argv_of(spec, "j-4", work), work) == (None, False)  # a fresh j-4 loads nothing
    assert os.path.isabs(other)  # (torchtitan's newer releases take an absolute initial_load_path only)


def test_torchtitan_a_rollback_resumes_its_own_newest_and_saving_off_is_turned_on(tmp_path):
    spec = job(tmp_path, "torchtitan", TITAN)
    work = tmp_path / "work"
    other = saved(work / "outputs" / "checkpoint" / "j-3" / "step-40", ".metadata")
    own = saved(work / "outputs" / "checkpoint" / "j-4" / "step-60", ".metadata")
    assert titan_loads(argv_of(spec, "j-4", work, resume_from=own), work) == (own, True)
    # a rollback before j-4 saved (gpujob falls back to the --resume-from one): still j-3's
    (work / "outputs" / "checkpoint" / "j-4" / "step-60" / ".metadata").unlink()
    (work / "outputs" / "checkpoint" / "j-4" / "step-60").rmdir()
    (work / "outputs" / "checkpoint" / "j-4").rmdir()
    assert titan_loads(argv_of(spec, "j-4", work, resume_from=other), work) == (other, True)
    off = job(tmp_path, "torchtitan", TITAN + " --checkpoint.no-enable")
    assert titan_loads(argv_of(off, "j-5", work), work) == (None, False)  # saving off as the command says
    assert titan_loads(argv_of(off, "j-5", work, resume_from=other), work) == (other, True)
    assert argv_of(off, "j-5", work, resume_from=other).count("--checkpoint.enable") == 1
