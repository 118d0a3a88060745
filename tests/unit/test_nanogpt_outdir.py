"""nanoGPT's one ckpt.pt per job (issue 38 row 4, item 3): --init_from=resume loads OUT/ckpt.pt and
every save rewrites that one file, so the recipe gives each job its own --out_dir=OUT/{job_id}
and its checkpoint path follows; the warmup keeps its own folder and its warm key."""

from __future__ import annotations

import shlex
from pathlib import Path

import yaml

from gpujob.agent.base.envs import keyed_command
from gpujob.agent.base.placeholders import command_argv, substitute
from gpujob.spec import selfload
from gpujob.spec.model import load_spec

BASE = {"name": "j", "target": "box", "profiles": [{"name": "base", "system_site_packages": True}]}


def spec_of(tmp_path: Path, command, **train):
    data = {**BASE, "recipe": "nanogpt", "train": {"command": command, **train},
            "throughput": {"min_ratio": 0.8, "tokens_per_step": 100}}
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    return load_spec(tmp_path / "job.yaml")


def test_each_job_gets_its_own_out_dir_and_ckpt_pt(tmp_path):
    spec = spec_of(tmp_path, "python train.py --batch_size=4")
    assert spec.train.command == "python train.py --batch_size=4 --log_interval=1 --out_dir=out/{job_id}"
    assert spec.train.checkpoint.path == "out/{job_id}/ckpt.pt"
    assert spec.train.resume_args == ["--init_from=resume"]
    argv = command_argv(spec.train.command, {"job_id": "j-1"})
    assert argv[-1].endswith("--out_dir=out/j-1")  # what runs: the last --out_dir wins in nanoGPT
    assert substitute(spec.train.checkpoint.path, {"job_id": "j-1"}) == "out/j-1/ckpt.pt"
    # the warmup keeps its own folder (no {job_id}), and a resubmit its warm key
    assert "{job_id}" not in spec.warmup.command
    assert spec.warmup.command.endswith("--out_dir={workdir}/gpujob-warmup")
    other = spec_of(tmp_path, "python train.py --batch_size=4 --out_dir=elsewhere")
    ignore = list(spec.warmup.ignore_flags)
    assert keyed_command(spec.warmup.command, ignore) == keyed_command(other.warmup.command, ignore)


def test_the_commands_own_out_dir_gets_the_job_under_it(tmp_path):
    spec = spec_of(tmp_path, "python train.py config/x.py --out_dir=runs/")
    assert spec.train.command.endswith("--out_dir=runs/ --log_interval=1 --out_dir=runs/{job_id}")
    assert spec.train.checkpoint.path == "runs/{job_id}/ckpt.pt"
    spec = spec_of(tmp_path, "python train.py --out_dir='my runs'")  # quoted up to the bare placeholder
    words = shlex.split(substitute(spec.train.command, {"job_id": "j-2"}, shlex.quote))
    assert words[-1] == "--out_dir=my runs/j-2"
    assert spec.train.checkpoint.path == "my runs/{job_id}/ckpt.pt"
    spec = spec_of(tmp_path, ["python", "train.py"])
    assert spec.train.command[-1] == "--out_dir=out/{job_id}"
    # left alone: an out_dir with {job_id} in it, a checkpoint path of the spec's own
    spec = spec_of(tmp_path, "python train.py --out_dir=o/{job_id}/x")
    assert spec.train.command.count("--out_dir") == 1 and spec.train.checkpoint.path == "o/{job_id}/x/ckpt.pt"
    spec = spec_of(tmp_path, "python train.py", checkpoint={"path": "shared/ckpt.pt"})
    assert "--out_dir" not in spec.train.command and spec.train.checkpoint.path == "shared/ckpt.pt"


def test_selfload_says_nothing_of_an_earlier_jobs_ckpt_for_a_per_job_out_dir():
    assert selfload.self_loads("nanogpt", "python train.py --init_from=resume --out_dir=out/{job_id}") is None
    why = selfload.self_loads("nanogpt", "python train.py --init_from=resume --out_dir=shared")
    assert why is not None and "shared/ckpt.pt" in why


def test_a_fixed_place_is_one_path_and_resume_args_without_resume_from():
    from gpujob.agent.base.ckpaths import fixed_place
    assert fixed_place("out/{job_id}/ckpt.pt", ["--init_from=resume"])
    assert fixed_place("ckpt/{job_id}/latest", [])  # a directory, reloaded by the trainer itself
    assert not fixed_place("out/{job_id}/checkpoint-*", ["--init_from=resume"])  # a glob: no one place
    assert not fixed_place("out/ckpt.pt", ["--resume_from_checkpoint", "{resume_from}"])  # given the path
