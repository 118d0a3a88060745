"""bench/recipes_gpu/torchtitan_tiny.py, the tiny torchtitan 0.2.2 job of the device's
torchtitan lane: its train.toml holds what the torchtitan recipe's keys assume (the dump
folder and checkpoint folder the recipe's path names, saving on, a log line per step
from the recipe), and a line torchtitan 0.2.2 printed (CPU rehearsal) is read by the
recipe's format. Training itself ran on the CPU rehearsal (see the branch's report)."""

from __future__ import annotations

import json
import tomllib

import pytest

from bench.recipes_gpu import torchtitan_tiny as tiny
from gpujob.agent.judge.throughput import make_parser, make_step_parser
from gpujob.spec.recipes.registry import RECIPES

#: torchtitan 0.2.2's metrics line (torch 2.11.0 CPU rehearsal, step 12): 24-bit colours and grad_norm
REAL_LINE = ("[titan] 2026-12-02 07:47:15,931 - root - INFO - \x1b[31mstep: 12  \x1b[32mloss:  6.64044  "
             "\x1b[38;2;180;60;0mgrad_norm:  1.1316  \x1b[38;2;54;234;195mmemory: -0.00GiB(-0.00%)  "
             "\x1b[34mtps: 1,601  \x1b[36mtflops: 0.06  \x1b[35mmfu: 0.02%\x1b[39m")


@pytest.mark.parametrize("device", ["cuda", "cpu"])
def test_the_toml_is_what_the_recipe_assumes(device):
    conf = tomllib.loads(tiny.toml(device))
    command = "torchrun --nproc_per_node 1 -m torchtitan.train --job.config_file train.toml --compile.enable"
    frag = RECIPES["torchtitan"].derive({"train": {"command": command}})
    # the recipe gives each job its own checkpoint folder (--checkpoint.folder beats the TOML's)
    folder = f"{conf['job']['dump_folder']}/checkpoint/{{job_id}}/step-*"
    assert frag["train"]["checkpoint"]["path"] == folder
    assert "--checkpoint.folder checkpoint/{job_id}" in frag["train"]["command"]
    assert conf["checkpoint"]["enable"] is True and conf["checkpoint"]["last_save_model_only"] is False
    assert conf["model"]["flavor"] == tiny.SIZES[device][0]
    assert conf["training"]["dataset"] == "c4_test" and conf["training"]["dataset_path"] == "data"
    assert "log_freq" not in conf.get("metrics", {})  # the recipe's --metrics.log_freq 1 is the one
    assert tomllib.loads(tiny.toml(device, "debugmodel"))["model"]["flavor"] == "debugmodel"


def test_a_real_torchtitan_line_is_read_by_the_recipes_format():
    assert make_parser("torchtitan")(REAL_LINE) == 1601
    assert make_step_parser("torchtitan")(REAL_LINE) == 12


def test_documents_are_deterministic_and_long_enough_for_a_sequence():
    docs = tiny.documents(count=50)
    assert docs == tiny.documents(count=50) and len(docs) == 50
    assert min(len(d.split()) for d in docs) >= 80


def test_build_writes_a_tokenizer_below_the_models_vocabulary(tmp_path):
    # on the device image; not a test dependency: it brings huggingface-hub and click into the venv,
    # which the suite's last clean-clone run did not have
    pytest.importorskip("tokenizers")
    got = tiny.build(tmp_path, "cpu")
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tmp_path / "assets" / "tokenizer.json"))
    assert got["vocab"] == tok.get_vocab_size() <= tiny.VOCAB
    special = json.loads((tmp_path / "assets" / "tokenizer_config.json").read_text())
    assert (tok.token_to_id(special["bos_token"]) is not None
            and tok.token_to_id(special["eos_token"]) is not None)
    ids = tok.encode("kato rimu sena.").ids
    assert ids and max(ids) < tiny.VOCAB
    first = json.loads((tmp_path / "data" / "train.jsonl").read_text().splitlines()[0])
    assert set(first) == {"text"}
    assert (tmp_path / "train.toml").exists()
