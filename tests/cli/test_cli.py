"""The CLI's door: bad input is one line and exit 2 (never a traceback), the
the README's DFlash plan validates."""

from __future__ import annotations

import json
import shlex
from pathlib import Path
import shutil
import os
import re

import pytest

from clirun import cli
from helpers import local_env

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def env(tmp_path):
    return local_env(tmp_path)


def one_line_error(p) -> str:
    assert b"Traceback" not in p.stderr, p.stderr.decode()
    lines = [ln for ln in p.stderr.decode().splitlines() if not ln.startswith("  hint:")]
    assert len(lines) == 1, p.stderr.decode()
    return lines[0]


@pytest.mark.parametrize("text, expect", [
    ("name: x\ntarget: box\nprofiles: []\ntrain: {command: t}\n", "job.yaml:3: profiles: "),
    ("name: x\n  bad: [\n", "job.yaml:2: not valid YAML"),
    ("- a\n- b\n", "job.yaml:1: "),
    ("name: x\ntrian: {command: t}\n", "job.yaml:2: trian: unknown field; did you mean 'train'?"),
    ("name: x\nprofiles:\n  - {name: a, index_url: 'https://x', packages: [torch==1]}\ntrain: {command: t}\n"
     "throughput:\n  format: ktok\n  min: fast\n",
     "job.yaml:7: throughput.min: expected a number, got 'fast'"),
])
def test_bad_specs_give_one_line_and_exit_2(tmp_path, env, text, expect):
    spec = tmp_path / "job.yaml"
    spec.write_text(text)
    for args in (["submit", str(spec)], ["submit", str(spec), "--plan"]):
        p = cli(args, env)
        assert p.returncode == 2
        assert expect in one_line_error(p)
    assert not (tmp_path / "root").exists()  # nothing half-changed on the target side


def test_bad_inventory_and_targets(tmp_path):
    env = dict(os.environ, XDG_STATE_HOME=str(tmp_path / "state"))
    bad = tmp_path / "hosts.yaml"
    bad.write_text("hosts:\n  pve:\n    address: 10.0.0.1\n    containers:\n      ct: {vmid: '200'}\n")
    p = cli(["--hosts", str(bad), "exec", "ct", "--", "true"], env)
    assert p.returncode == 2 and "hosts.yaml:5: " in one_line_error(p) and "vmid" in one_line_error(p)
    p = cli(["--hosts", str(tmp_path / "missing.yaml"), "hosts"], env)
    assert p.returncode == 2 and "no such file" in one_line_error(p)
    good = local_env(tmp_path)
    p = cli(["exec", "bx", "--", "true"], good)
    assert (p.returncode == 2 and "unknown target 'bx'" in one_line_error(p)
            and "did you mean 'box'" in p.stderr.decode())
    p = cli(["logs", "--phase", "bogus"], good)
    assert p.returncode == 2 and "--phase" in one_line_error(p)
    p = cli(["status"], good)
    assert p.returncode == 5 and "no jobs yet" in one_line_error(p)


def test_exec_on_the_local_target(env):
    p = cli(["exec", "box", "--", "sh", "-c", "echo out; echo err >&2; exit 3"], env)
    assert (p.returncode, p.stdout, p.stderr) == (3, b"out\n", b"err\n")
    p = cli(["exec", "box", "--timeout", "0.5", "--", "sleep", "30"], env)
    assert p.returncode == 124 and b"timed out" in p.stderr


def test_doctor_on_the_local_target_warns_on_gpus(env):
    p = cli(["doctor", "box", "--json"], env)
    assert p.returncode == 0, p.stdout
    checks = {c["name"]: c["status"] for c in json.loads(p.stdout)["lab/box"]}
    assert checks["python3"] == "ok"
    # no GPU here: a warning, not a failure; where nvidia-smi runs, the GPUs it lists are ok
    assert checks["gpus"] == ("ok" if shutil.which("nvidia-smi") else "warn")


def test_dflash_plan_validates_and_prints_the_steps(tmp_path):
    env = dict(os.environ, XDG_STATE_HOME=str(tmp_path / "state"))
    p = cli(["submit", "jobs/dflash.yaml", "--plan"], env)  # ./hosts.yaml: pve1/ct200 at 10.1.2.6
    assert p.returncode == 0, p.stderr.decode()
    out = p.stdout.decode()
    assert "root@10.1.2.6:22" in out and "pct exec 200 --" in out
    assert "--index-url https://download.pytorch.org/whl/cu128 torch==2.11.0+cu128" in out
    # the real SpecForge CLI with its dotted overrides, each job's own output dir (the last one
    # wins); its own warmup in a dir and run id of its own
    assert re.search(r"'python -m specforge\.cli train -c dflash/run\.yaml output_dir=/root/dflash/outputs "
                     r"run_id=dflash training\.log_interval=10 "
                     r"output_dir=/root/dflash/outputs/dflash-[a-z0-9]{4}'",
                     out)
    assert "training.max_steps=3 training.save_interval=0 training.eval_interval=0 " \
           "output_dir=/root/dflash/gpujob-warmup run_id=gpujob-warmup" in out
    assert ("--no-deps specforge==0.2.0" in out
            and "sglang" not in out.split("--no-deps")[0].split("uv pip")[-1])
    assert "from recipe specforge: train.resume_args = [\"training.resume_from={resume_from}\"]" in out
    assert "'\"'\"'training.resume_from=<newest finished checkpoint of this job>'\"'\"'" in out
    assert 'from recipe specforge: train.checkpoint.path = "outputs/{job_id}/dflash-step*"' in out
    assert 'from recipe specforge: train.checkpoint.done_file = "training_state.pt"' in out
    assert 'from recipe specforge: throughput.ranks = "first"' in out
    assert "from recipe specforge: train.checkpoint.every" not in out  # the spec's own
    # the one-GPU run of the spec's head: its --set items, the overrides where SpecForge reads them
    head = [ln for ln in (REPO / "jobs" / "dflash.yaml").read_text().splitlines() if "--set" in ln]
    sets = [a for ln in head for a in shlex.split(ln.lstrip("# ").rstrip(" \\"))[1:] if a != "--set"]
    one = cli(["submit", "jobs/dflash.yaml", "--plan", *[x for a in sets for x in ("--set", a)]], env)
    assert one.returncode == 0, one.stderr.decode()
    text = one.stdout.decode()
    assert "python -m specforge.cli train -c dflash/run.yaml output_dir=/root/dflash/outputs run_id=dflash " \
           "deployment.trainer.nproc_per_node=1 data.hidden_states_path=/tmp/tiny/features " \
           "model.target_model_path=/tmp/tiny/target training.log_interval=10 " \
           "output_dir=/root/dflash/outputs/dflash-" in text
    assert "--set throughput.tokens_per_step = 64" in text
    p = cli(["submit", "jobs/dflash.yaml", "--plan", "--profile", "cu130"], env)
    assert "whl/cu130 torch==2.11.0+cu130" in p.stdout.decode()


@pytest.mark.parametrize("args", [[], ["nosuch"], ["logs", "--tail", "x"], ["exec"], ["submit"]])
def test_usage_errors_exit_2_without_a_traceback(env, args):
    p = cli(args, env)
    assert p.returncode == 2 and b"Traceback" not in p.stderr + p.stdout


def test_version(env):
    assert cli(["--version"], env, check=True).stdout.decode().startswith("gpujob ")


@pytest.mark.parametrize("target", ["lab/box", "[lab/box, lab/box2]"])
def test_resume_from_without_a_checkpoint_section_is_one_line_for_one_node_and_many(tmp_path, env, target):
    spec = tmp_path / "job.yaml"
    spec.write_text(f"name: x\ntarget: {target}\nprofiles: [{{name: p, system_site_packages: true}}]\n"
                    "train: {command: python t.py}\nthroughput: null\n")
    for args in (["submit", str(spec), "--resume-from", "x-abcd"],
                 ["submit", str(spec), "--resume-from", "x-abcd", "--plan"]):
        p = cli(args, env)
        assert p.returncode == 2
        assert one_line_error(p) == ("gpujob: --resume-from needs train.checkpoint in the spec "
                                     "(path and every)")
    assert not (tmp_path / "root").exists()
