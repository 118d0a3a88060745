"""bench/recipes_gpu/specforge_tiny.py, the tiny SpecForge DFlash run for the device: its run
config keeps every field of the shipped jobs/dflash/run.yaml (so the device run exercises the
names a user's run does), at one process; bad input is one line. Building the model and the
features needs torch and transformers: that part ran on the CPU rehearsal (see its report)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml

from bench.recipes_gpu import specforge_tiny as tiny
from gpujob.spec.recipes.specforge import SPECFORGE_PATTERN

REPO = Path(__file__).resolve().parents[2]

#: a line SpecForge 0.2.0 printed (offline DFlash, CPU rehearsal, step 30 of 30)
REAL_LINE = ("step 30: {'acc': 0.0, 'loss': 6.968338489532471, 'grad_norm': 0.778773844242096, 'lr': 0.0, "
             "'perf/optimizer_steps_per_hour': 17088.74895566271, 'perf/optimizer_step_time_s': "
             "0.2106649240000138, 'perf/data_wait_time_s': 0.00018417600000475431, "
             "'perf/train_compute_time_s': 0.21046502500001907, 'perf/durable_ack_time_s': 0.0, "
             "'perf/global_samples_per_second': 9.493749419812616}")


def paths(node: dict, prefix: str = "") -> set:
    out = set()
    for key, value in node.items():
        out |= paths(value, f"{prefix}{key}.") if isinstance(value, dict) else {prefix + key}
    return out


def config(tmp_path: Path, *argv: str) -> dict:
    import argparse
    ns = argparse.Namespace(device="cuda", batch=2, epochs=100000, max_steps=100000, save_interval=100,
                            workers=2)
    for item in argv:
        key, value = item.split("=")
        setattr(ns, key, type(getattr(ns, key))(value))
    return json.loads(tiny.run_yaml(tmp_path, 256, ns))


def test_the_tiny_run_config_keeps_every_field_of_the_shipped_one_at_one_process(tmp_path):
    shipped = yaml.safe_load((REPO / "jobs" / "dflash" / "run.yaml").read_text())
    cfg = config(tmp_path)
    assert paths(shipped) - paths(cfg) == set()
    assert cfg["deployment"]["trainer"]["nproc_per_node"] == 1
    assert cfg["data"]["hidden_states_path"] == str(tmp_path / "features")
    assert cfg["model"]["target_model_path"] == str(tmp_path / "target")
    # no tokenizer is shipped: the MASK id is given, inside the target's vocabulary
    assert 0 <= cfg["model"]["mask_token_id"] < tiny.TARGET["vocab_size"]
    assert cfg["training"]["max_steps"] == 100000 and cfg["training"]["save_interval"] == 100
    assert cfg["training"]["attention_backend"] == "flex_attention"
    assert config(tmp_path, "device=cpu")["training"]["attention_backend"] == "sdpa"


def test_bad_sizes_are_one_line_and_exit_2(tmp_path, capsys):
    assert tiny.main(["--out", str(tmp_path), "--samples", "0"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--samples" in err and "Traceback" not in err


def test_a_line_specforge_0_2_0_printed_is_read_by_the_recipe():
    m = re.search(SPECFORGE_PATTERN, REAL_LINE)
    assert m and m["step"] == "30" and float(m["value"]) == 9.493749419812616
