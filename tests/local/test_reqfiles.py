"""`requirements:` entries that name a project's requirements file ({file, exclude}),
as jobs/dflash.yaml does with SpecForge's: read on the laptop, lines of pinned
packages and excluded ones left out (the plan says so), content in the venv key,
a missing file a plan note and a one-line submit error; and the DFlash warmup's
shapes read from the drafter's config."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import yaml

from gpujob.errors import SpecError
from gpujob.spec.model import load_spec
from helpers import REPO, cli, local_env

SPECFORGE_STYLE = """pre-commit
torch==2.9.1
torchaudio==2.9.1
torchvision==0.24.1
transformers==4.57.1   # the tokenizer needs it
# a comment line

datasets
Qwen-VL_utils==0.0.11
sglang[all]==0.5.6
"""


def spec_text(file_entry: str = "{file: reqs/requirements.txt, exclude: [torchaudio, sglang]}") -> str:
    return f"""name: rq
target: box
requirements:
  - accelerate
  - {file_entry}
profiles:
  - name: cu128
    index_url: https://download.pytorch.org/whl/cu128
    packages: ["torch==2.11.0+cu128", "torchvision==0.26.0+cu128"]
train: {{command: python train.py}}
"""


@pytest.fixture
def spec(tmp_path):
    (tmp_path / "reqs").mkdir()
    (tmp_path / "reqs" / "requirements.txt").write_text(SPECFORGE_STYLE)
    path = tmp_path / "job.yaml"
    path.write_text(spec_text())
    return path


def test_a_requirements_file_joins_the_common_requirements(spec, tmp_path):
    s = load_spec(spec)
    got, notes = s.common_requirements(strict=True)
    assert got == ["accelerate", "pre-commit", "transformers==4.57.1", "datasets", "Qwen-VL_utils==0.0.11"]
    assert len(notes) == 1 and "left out torch==2.9.1, torchaudio==2.9.1, torchvision==0.24.1, " \
                                 "sglang[all]==0.5.6" in notes[0]
    assert s.to_agent_dict()["requirements"] == got
    key = s.env_key("cu128")
    (tmp_path / "reqs" / "requirements.txt").write_text(SPECFORGE_STYLE + "wandb\n")
    assert load_spec(spec).env_key("cu128") != key  # an edited file builds a new venv


def test_the_plan_installs_the_file_s_lines_and_says_what_it_left_out(spec, tmp_path):
    p = cli(["submit", str(spec), "--plan"], local_env(tmp_path))
    out = p.stdout.decode()
    assert p.returncode == 0, p.stderr.decode()
    assert "accelerate pre-commit transformers==4.57.1 datasets Qwen-VL_utils==0.0.11" in out
    assert "left out torch==2.9.1, torchaudio==2.9.1" in out and "sglang" not in out.split("left out")[0]


def test_a_missing_file_is_a_plan_note_and_a_one_line_submit_error(tmp_path):
    spec = tmp_path / "job.yaml"
    spec.write_text(spec_text("{file: ../nowhere/requirements.txt}"))
    env = local_env(tmp_path)
    p = cli(["submit", str(spec), "--plan"], env)
    assert p.returncode == 0 and "no such file" in p.stdout.decode() and "submit refuses" in p.stdout.decode()
    p = cli(["submit", str(spec)], env)
    err = p.stderr.decode().strip()
    assert p.returncode == 2 and len(err.splitlines()) == 1, err
    assert ("job.yaml:5: requirements[1].file: no such file: "
            f"{(tmp_path.parent / 'nowhere' / 'requirements.txt')}") in err
    assert not (tmp_path / "root").exists()  # nothing changed on the target side


def test_an_option_line_is_refused_at_submit(spec, tmp_path):
    (tmp_path / "reqs" / "requirements.txt").write_text("datasets\n-e .\n")
    with pytest.raises(SpecError, match=r"requirements\[1\]\.file: .*requirements.txt:2: only requirement "
                                        r"lines are read, got '-e .'"):
        load_spec(spec).common_requirements(strict=True)


@pytest.mark.parametrize("entry, expect", [
    ("{file: 5}",
     "job.yaml:5: requirements[1].file: expected the path of a requirements file, got an integer"),
    ("{fil: x.txt}", "job.yaml:5: requirements[1].fil: unknown field; expected file and exclude"),
    ("{file: x.txt, exclude: torch}",
     "job.yaml:5: requirements[1].exclude: expected a list of package names"),
    ("5", "job.yaml:5: requirements[1]: expected a requirement string, {file: PATH, exclude: [...]} or "
          "{package: REQ, no_deps: true}"),
])
def test_bad_entries_are_one_line(tmp_path, entry, expect):
    spec = tmp_path / "job.yaml"
    spec.write_text(spec_text(entry))
    p = cli(["submit", str(spec), "--plan"], local_env(tmp_path))
    err = p.stderr.decode().strip()
    assert p.returncode == 2 and len(err.splitlines()) == 1 and expect in err, err


def test_the_dflash_warmup_reads_its_shapes_from_the_drafter_s_config(tmp_path):
    script = REPO / "jobs" / "dflash" / "warmup_drafter.py"
    cfg = tmp_path / "qwen3-8b-dflash.json"
    cfg.write_text(json.dumps({"num_attention_heads": 32, "head_dim": 128, "block_size": 16,
                               "dtype": "bfloat16", "hidden_size": 4096}))
    small = tmp_path / "small.json"
    small.write_text(json.dumps({"num_attention_heads": 16, "hidden_size": 2048, "block_size": 8,
                                 "torch_dtype": "float16"}))
    for args, line in [
        (["--config", str(cfg), "--seq-len", "4096"],
         f"warmup: shapes heads=32 head_dim=128 seq_len=4096 block_size=16 dtype=bfloat16 (from {cfg})"),
        (["--config", str(small), "--seq-len", "2048"],  # head_dim = hidden_size / heads
         f"warmup: shapes heads=16 head_dim=128 seq_len=2048 block_size=8 dtype=float16 (from {small})"),
        (["--config", str(small), "--heads", "8"],  # a flag overrides the config
         f"warmup: shapes heads=8 head_dim=256 seq_len=4096 block_size=8 dtype=float16 (from {small})"),
    ]:
        p = subprocess.run([sys.executable, str(script), *args], capture_output=True, timeout=60)
        assert p.stdout.decode().splitlines()[0] == line  # printed before torch is imported


def test_the_dflash_example_validates_and_its_run_config_is_specforge_s():
    s = load_spec(REPO / "jobs" / "dflash.yaml")
    assert s.recipe == "specforge" and {"package": "specforge==0.2.0", "no_deps": True} in s.requirements
    assert not any(isinstance(r, str) and r.startswith("sglang") for r in s.requirements)
    assert "{workdir}" in s.train.command and "/root/dflash" not in s.train.command
    assert [p.packages for p in s.profiles] == [["torch==2.11.0+cu128"], ["torch==2.11.0+cu130"]]
    assert all(not p.env for p in s.profiles)  # profiles differ only in wheels: SpecForge's resume checks
    run = yaml.safe_load((REPO / "jobs" / "dflash" / "run.yaml").read_text())
    assert set(run) <= {"run_id", "output_dir", "model", "data", "training", "tracking", "deployment"}
    assert run["data"]["hidden_states_path"] and run["training"]["strategy"] == "dflash"
    assert run["run_id"] in s.train.checkpoint.path
