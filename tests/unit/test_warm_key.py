"""The warm marker's key leaves out what changes nothing compiled (issue 38 row 8): with each
recipe's ``warmup.ignore_flags``, a change of the save interval, the output dir or the step
count alone keeps the cache warm; a change of the model's size makes it cold (two submits on the local
kind: tests/local/test_warm_key_local.py)."""

from __future__ import annotations

import pytest

from gpujob.agent.base import envs
from test_recipe_keys import agent_spec

PROFILE = {"name": "p", "env": {}}

# recipe -> (command, a change that compiles nothing, a change that does, tokens_per_step)
CASES = {
    "hf_trainer": ("python train.py --output_dir out --per_device_train_batch_size 8 --max_seq_length 1024 "
                   "--save_steps 200", ("--save_steps 200", "--save_steps 50 --logging_steps 5"),
                   ("--per_device_train_batch_size 8", "--per_device_train_batch_size 16"), None),
    "nanogpt": ("python train.py --batch_size=12 --eval_interval=250", ("--eval_interval=250",
                "--eval_interval=100 --max_iters=9000 --out_dir=o2"), ("--batch_size=12", "--batch_size=16"),
                None),
    "lightning": ("python main.py fit --trainer.callbacks+=ModelCheckpoint "
                  "--trainer.callbacks.every_n_train_steps=50",
                  ("every_n_train_steps=50", "every_n_train_steps=500 --trainer.max_steps 99"),
                  ("fit", "fit --model.dim 512"), 10),
    "torchtitan": ("torchrun --nproc_per_node 1 -m torchtitan.train --job.config_file t.toml "
                   "--checkpoint.interval 100",
                   ("--checkpoint.interval 100", "--checkpoint.interval 500 --training.steps 7"),
                   ("t.toml", "t.toml --compile.enable"), None),
    "specforge": ("python -m specforge.cli train -c run.yaml output_dir=out run_id=r "
                  "training.save_interval=100",
                  ("training.save_interval=100", "training.save_interval=7 run_id=q"),
                  ("-c run.yaml", "-c run2.yaml"), 512),
}


def warm_key(tmp_path, recipe: str, command: str, tokens) -> str:
    extra = {"throughput": {"tokens_per_step": tokens}} if tokens else {}
    _spec, data = agent_spec(tmp_path, recipe, command, **extra)
    return envs.warm_hash(data["warmup"], [], PROFILE, "k")


@pytest.mark.parametrize("recipe", sorted(CASES))
def test_a_save_interval_keeps_the_cache_warm_and_a_model_change_does_not(tmp_path, recipe):
    command, (a, b), (c, d), tokens = CASES[recipe]
    assert a in command and c in command
    key = warm_key(tmp_path, recipe, command, tokens)
    assert warm_key(tmp_path, recipe, command.replace(a, b), tokens) == key
    assert warm_key(tmp_path, recipe, command.replace(c, d), tokens) != key


def test_the_keyed_command_drops_each_form_of_an_ignored_flag():
    ig = ["--save_steps", "--out_dir", "training.save_interval", "--flag"]
    argv = ["python", "t.py", "--save_steps", "5", "--out_dir=x", "training.save_interval=3", "--flag",
            "--keep", "1", "--save_steps_extra", "2", "training.save_interval_x=1"]
    assert envs.keyed_command(argv, ig) == ["python", "t.py", "--keep", "1", "--save_steps_extra", "2",
                                            "training.save_interval_x=1"]
    assert envs.keyed_command("python t.py --save_steps 5 --lr 1", ig) == ["python", "t.py", "--lr", "1"]
    # no list: as is
    assert envs.keyed_command("python t.py --save_steps 5", []) == "python t.py --save_steps 5"
    assert envs.keyed_command("python 't.py", ig) == "python 't.py"  # unbalanced: as is


