"""Each recipe's conventions run end to end on the `local` kind through a stand-in
(tests/data/recipes/standin.py prints that trainer's lines and keeps its
checkpoints): the recipe's warmup (a few real steps, in a folder of its own, no
saves), its throughput pattern, its checkpoint path, its resume."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from gpujob.spec.recipes.registry import RECIPES
from helpers import cli, events, job_id_of, local_env, wait_for
from test_jobs_local import journal, status

STANDIN = Path(__file__).parents[1] / "data" / "recipes"

CASES = {
    "specforge": ("specforge",
                  "python standin.py specforge -c run.yaml output_dir={workdir}/outputs run_id=tiny "
                  "training.log_interval=1 training.save_interval=2", 1000,
                  "outputs/r-specforge-*/tiny-step*/training_state.pt"),  # an output_dir per job
    # one evaluation, at step 150 (fast: 7.5 s in, 6.5 s before the end: longer than a pause lasts)
    "hf_trainer": ("hf", "python standin.py hf --output_dir out --per_device_train_batch_size 1 "
                   "--max_seq_length 1000 --eval_steps 150 --max_steps 280", None,
                   "out/r-hf-trainer-*/checkpoint-*/trainer_state.json"),  # an --output_dir per job
    "torchtitan": ("torchtitan", "python standin.py torchtitan --checkpoint.enable", None,
                   "outputs/checkpoint/r-torchtitan-*/step-*/.metadata"),  # a folder per job
    # 150 steps: the recipe reads Lightning's bar by its step counter over time (a sample per
    # 0.5 s), so the resumed fast run needs a few seconds to be judged (60 steps: 2.5 s)
    "lightning": ("lightning", "python standin.py lightning fit --trainer.callbacks+=ModelCheckpoint "
                  "--trainer.callbacks.every_n_train_steps=16 --trainer.max_steps=150", 1000,
                  "lightning_logs/version_*/checkpoints/*.ckpt"),
    # tokens per iteration read from its arguments; its eval (and save) every 200 iterations (10 s fast)
    "nanogpt": ("nanogpt", "python standin.py nanogpt --batch_size=1 --block_size=1000 "
                "--gradient_accumulation_steps=1 --eval_interval=200 --max_iters=400", None,
                "out/r-nanogpt-*/ckpt.pt"),  # an --out_dir per job
}
RESUMED = {  # how the resumed run was told where to start: the checkpoint gpujob chose
    "specforge": r"output_dir=\S*/outputs/r-specforge-[\w-]+ "  # an output_dir per job
                 r"training\.resume_from=\S*/outputs/r-specforge-[\w-]+/tiny-step\d+$",
    "hf_trainer": r"--output_dir out/r-hf-trainer-[\w-]+ "  # an --output_dir per job
                  r"--resume_from_checkpoint \S*/out/r-hf-trainer-[\w-]+/checkpoint-\d+$",
    # its own folder per job (no earlier job's step-N is loaded), --checkpoint.enable once
    "torchtitan": r"^(?!.*--checkpoint\.enable.*--checkpoint\.enable).*--checkpoint\.enable "
                  r"--checkpoint\.folder checkpoint/r-torchtitan-\w+ .*--checkpoint\.initial_load_path "
                  r"\S*/outputs/checkpoint/r-torchtitan-[\w-]+/step-\d+ "
                  r"--checkpoint\.no_initial_load_model_only$",
    "lightning": r"--ckpt_path '?\S*/lightning_logs/version_0/checkpoints/epoch=0-step=\d+\.ckpt'?$",
    "nanogpt": r"--out_dir=out/r-nanogpt-[\w-]+ --init_from=resume$",
}


def recipe_spec(path: Path, recipe: str, command: str, tokens, throughput: bool = True) -> Path:
    spec = {"recipe": recipe, "name": f"r-{recipe.replace('_', '-')}", "target": "box",
            "sync": [{"src": str(STANDIN), "dest": ".", "exclude": ["__pycache__"]}],
            "profiles": [{"name": "fast", "system_site_packages": True},
                         {"name": "slow", "system_site_packages": True, "env": {"SLOW": "1"}}],
            "profile": "slow",
            "train": {"command": command, "grace": "3s"},
            "rollback": {"fallback": ["fast"]}}
    spec["throughput"] = None  # no judging: the recipe's rate keys go with it
    if throughput:
        spec["throughput"] = {"window": 3, "min": "5K", "failure_limit": 2, "no_data_timeout": "30s",
                              "good_after": "1s"}
        if tokens:
            spec["throughput"]["tokens_per_step"] = tokens
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


@pytest.mark.parametrize("recipe", sorted(CASES))
def test_recipe_rolls_back_and_resumes_from_the_trainers_own_checkpoint(tmp_path, recipe):
    env = local_env(tmp_path)
    style, command, tokens, ckpt = CASES[recipe]
    spec = recipe_spec(tmp_path / "job.yaml", recipe, command, tokens)
    p = cli(["submit", str(spec), "--follow"], env, timeout=180)
    assert p.returncode == 0, p.stdout.decode()[-3000:] + p.stderr.decode()[-2000:]
    job_id = job_id_of(p.stdout)
    assert f"recipe {recipe} revision {RECIPES[recipe].revision} (" in p.stderr.decode()  # said at submit
    st = status(job_id, env)
    assert st["state"] == "succeeded" and st["profile"] == "fast"
    [rb] = st["rollbacks"]
    assert (rb["from"], rb["to"], rb["signal"]) == ("slow", "fast", "low_throughput")
    ev = events(journal(tmp_path, job_id))
    phases = [e for e in ev if e["type"] == "phase"]
    assert [e["phase"] for e in phases][:1] == ["warmup"]  # the trainer itself, a few steps, first
    trains = [e for e in phases if e["phase"] == "train"]
    assert [t["profile"] for t in trains] == ["slow", "fast"]
    assert re.search(RESUMED[recipe], trains[1]["argv"][-1]), trains[1]["argv"][-1]
    if recipe in ("hf_trainer", "nanogpt"):  # its eval line paused judging (throughput.pause_pattern)
        assert any(e["type"] == "pause" and e["why"] == "pause_pattern" for e in ev)
    log = (journal(tmp_path, job_id) / "train.log").read_text()
    assert "resumed from checkpoint at step" in log
    resumed_at = int(log.split("resumed from checkpoint at step ")[1].split()[0])
    assert resumed_at >= 2
    workdir = tmp_path / "root" / "work" / spec.stem.replace("job", f"r-{recipe.replace('_', '-')}")
    workdir = next((tmp_path / "root" / "work").iterdir())
    assert list(workdir.glob(ckpt)), f"no {ckpt} in {sorted(p.name for p in workdir.iterdir())}"
    warm = workdir / "gpujob-warmup"
    # the warmup ran in its own folder, outside the job's checkpoint path: nothing it saved is a resume point
    assert not any(warm in p.parents for p in workdir.glob(ckpt)) and str(warm) not in trains[1]["argv"][-1]
    # the others' warmups save nothing (Lightning's keeps the run's ModelCheckpoint:
    if recipe != "lightning":
        assert not list(warm.glob("**/*.pt")) and not list(warm.glob("**/trainer_state.json"))  # it refuses
        # enable_checkpointing false beside one)
    assert st["window_median"] >= 5000


def test_nanogpt_recipe_keeps_ckpt_pt_and_resumes_with_init_from(tmp_path):
    """With no judging (``throughput: null``), a rollback by hand proves nanoGPT's
    checkpoint and its resume, with the recipe's short log interval."""
    env = local_env(tmp_path)
    spec = recipe_spec(tmp_path / "job.yaml", "nanogpt", "python standin.py nanogpt --max_iters=400", None,
                       throughput=False)
    job_id = job_id_of(cli(["submit", str(spec)], env, check=True).stdout)
    train_log = journal(tmp_path, job_id) / "train.log"
    wait_for(lambda: train_log.exists() and "iter 6:" in train_log.read_text(), 90, what="six iterations")
    workdir = next((tmp_path / "root" / "work").iterdir())
    assert (workdir / "out" / job_id / "ckpt.pt").exists() and not (workdir / "out" / "ckpt.pt").exists()
    cli(["rollback", job_id, "--to", "fast"], env, check=True)
    wait_for(lambda: "resumed from checkpoint at step" in train_log.read_text(), 60, what="resume")
    ev = events(journal(tmp_path, job_id))
    trains = [e for e in ev if e["type"] == "phase" and e["phase"] == "train"]
    assert trains[-1]["argv"][-1].endswith("--init_from=resume")
    assert "--log_interval=1" in trains[0]["argv"][-1]  # the recipe's short log interval
    cli(["stop", job_id], env, check=True)
