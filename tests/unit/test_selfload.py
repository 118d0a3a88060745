"""Trainers that load a checkpoint by themselves at a fresh start (issue 38 row 3): what
submit says about checkpoints earlier jobs left must be what really happens."""

from __future__ import annotations

from gpujob.spec import selfload
from gpujob.ops.submit import earlier_checkpoint_lines
from gpujob.spec.recipes.registry import RECIPES

RES = {"checkpoints": {"where": "/w/outputs/checkpoint/step-*",
                       "left": [{"path": "/w/outputs/checkpoint/step-600", "job": "j-1"}]}}


def test_the_torchtitan_recipe_gives_each_job_its_folder_and_the_note_says_never():
    cmd = RECIPES["torchtitan"].derive({"train": {"command": "torchrun -m torchtitan.train --job.config_file "
                                                             "t.toml"}})
    assert selfload.self_loads("torchtitan", cmd["train"]["command"]) is None
    [line] = earlier_checkpoint_lines(RES, selfload.earlier_note("torchtitan", cmd["train"]["command"]))
    assert "this job never resumes from them" in line


def test_a_shared_torchtitan_folder_is_said_to_be_loaded():
    cmd = "torchrun -m torchtitan.train --job.config_file t.toml --checkpoint.folder ck"
    [line] = earlier_checkpoint_lines(RES, selfload.earlier_note("torchtitan", cmd))
    assert "never resumes" not in line
    assert "torchtitan loads the newest step-N in its checkpoint folder (ck" in line
    assert selfload.self_loads("torchtitan", cmd + "/{job_id}") is None
    assert selfload.self_loads("torchtitan", cmd + " --checkpoint.no-enable") is None


def test_each_recipe_that_loads_by_itself_is_named():
    assert "example scripts" in selfload.self_loads("hf_trainer", "python run_clm.py --output_dir out")
    assert selfload.self_loads("hf_trainer",
                               "python run_clm.py --output_dir out --overwrite_output_dir") is None
    assert "--init_from=resume" in selfload.self_loads("nanogpt", "python train.py --init_from=resume")
    assert selfload.self_loads("nanogpt", "python train.py") is None
    assert "--ckpt_path" in selfload.self_loads("lightning",
                                                ["python", "main.py", "fit", "--ckpt_path", "x.ckpt"])
    assert selfload.self_loads("lightning", "python main.py fit") is None
    assert "training.resume_from" in selfload.self_loads("specforge",
                                                         "specforge train training.resume_from=/x")
    assert selfload.self_loads(None, "python train.py --init_from=resume") is None
    assert "never resumes" in earlier_checkpoint_lines(RES)[0]


def test_plan_warns_when_the_commands_save_interval_is_beyond_the_run_and_a_rollback_would_wait():
    hf = "python run_clm.py --output_dir out --save_steps 5000 --max_steps 600"
    w = selfload.save_warning("hf_trainer", hf, True, 1860.0)
    assert w.startswith("the command saves every 5000 steps (--save_steps) and runs 600") and "1860s" in w
    assert selfload.save_warning("hf_trainer", hf, False, 1860.0) is None  # no wait: nothing held
    assert selfload.save_warning("hf_trainer", hf.replace("5000", "200"), True, 1860.0) is None
    assert "eval_interval" in selfload.save_warning("nanogpt",
                                                    "python train.py --eval_interval=2000 --max_iters=500",
                                                    True, 60.0)
    assert "checkpoint.interval" in selfload.save_warning(
        "torchtitan", "torchrun -m torchtitan.train --checkpoint.interval 500 --training.steps 100", True,
        60.0)
    assert "every_n_train_steps" in selfload.save_warning(
        "lightning", "python main.py fit --checkpoint.every_n_train_steps 900 --trainer.max_steps 300", True,
        60.0)
    assert selfload.save_warning("specforge", "x", True, 60.0) is None
