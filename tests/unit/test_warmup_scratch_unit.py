"""`warmup.scratch`: the spec's rule (a folder inside the workdir), the HF recipe's use of it,
and the agent's emptying (moved aside whole, links never followed, a death's leftovers
removed next time). The runs through the entry point are in tests/local/test_warmup_scratch.py."""

from __future__ import annotations

import os

import pytest
import yaml

from gpujob.agent.home import scratch
from gpujob.errors import SpecError
from gpujob.spec.model import load_spec

BASE = {"name": "j", "target": "box", "profiles": [{"name": "base", "system_site_packages": True}],
        "train": {"command": "python t.py"}}


def spec(tmp_path, value):
    data = dict(BASE, warmup={"command": "python t.py", "scratch": value})
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return load_spec(path)


@pytest.mark.parametrize("value,kept", [("out", "out"), ("{workdir}/gpujob-warmup", "gpujob-warmup"),
                                         ("a/b", "a/b")])
def test_a_folder_inside_the_workdir_is_taken(tmp_path, value, kept):
    assert spec(tmp_path, value).to_agent_dict()["warmup"]["scratch"] == kept


@pytest.mark.parametrize("value", ["../x", "/tmp/x", ".", "a/../../b", "{job_id}/x", "a//b", "{workdir}"])
def test_anything_else_is_one_line_at_its_key(tmp_path, value):
    with pytest.raises(SpecError) as e:
        spec(tmp_path, value)
    assert "warmup.scratch: expected a folder inside the workdir" in str(e.value)
    assert "\n" not in str(e.value).strip()


def test_the_hf_recipe_empties_its_warmup_output_dir(tmp_path):
    data = dict(BASE, recipe="hf_trainer", throughput={"min_ratio": 0.8},
                train={"command": "python train.py --output_dir out --per_device_train_batch_size 8 "
                                  "--max_seq_length 1024"})
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    w = load_spec(path).to_agent_dict()["warmup"]
    assert w["scratch"] == "gpujob-warmup"
    assert "--output_dir {workdir}/gpujob-warmup" in w["command"]


def test_empty_moves_the_folder_aside_and_removes_it(tmp_path):
    (tmp_path / "w" / "s" / "deep").mkdir(parents=True)
    (tmp_path / "w" / "s" / "deep" / "f").write_text("x")
    assert scratch.empty(str(tmp_path / "w"), "s") == str(tmp_path / "w" / "s")
    assert os.listdir(tmp_path / "w") == []
    assert scratch.empty(str(tmp_path / "w"), "s")  # nothing there: nothing to do
    assert scratch.empty(str(tmp_path / "none"), "s")  # no workdir yet either


def test_a_link_at_the_place_goes_as_a_link(tmp_path):
    (tmp_path / "w").mkdir()
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "keep").write_text("x")
    os.symlink(tmp_path / "elsewhere", tmp_path / "w" / "s")
    scratch.empty(str(tmp_path / "w"), "s")
    assert not os.path.lexists(tmp_path / "w" / "s")
    assert (tmp_path / "elsewhere" / "keep").read_text() == "x"


def test_a_link_above_the_place_refuses(tmp_path):
    (tmp_path / "w").mkdir()
    (tmp_path / "elsewhere" / "s").mkdir(parents=True)
    (tmp_path / "elsewhere" / "s" / "keep").write_text("x")
    os.symlink(tmp_path / "elsewhere", tmp_path / "w" / "a")
    with pytest.raises(scratch.ScratchError, match="is a link"):
        scratch.empty(str(tmp_path / "w"), "a/s")
    assert (tmp_path / "elsewhere" / "s" / "keep").read_text() == "x"


def test_a_removal_cut_short_is_finished_next_time(tmp_path):
    (tmp_path / "w" / f"{scratch.TRASH}123" / "x").mkdir(parents=True)
    (tmp_path / "w" / "s").mkdir()
    scratch.empty(str(tmp_path / "w"), "s")
    assert os.listdir(tmp_path / "w") == []


@pytest.mark.parametrize("sync_dest,scratch_value", [("t.py", "t.py"), ("src", "src"), ("src", "src/gen"),
                                                     ("src/lib", "src"), ("{workdir}/src", "src")])
def test_a_scratch_over_the_shipped_code_is_refused(tmp_path, sync_dest, scratch_value):
    (tmp_path / "t.py").write_text("")
    data = dict(BASE, sync=[{"src": str(tmp_path / "t.py"), "dest": sync_dest}],
                warmup={"command": "python t.py", "scratch": scratch_value})
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    with pytest.raises(SpecError, match="overlaps sync.0..dest"):
        load_spec(path)


@pytest.mark.parametrize("ck,refused", [("out/{job_id}/checkpoint-*", True), ("out/ckpt.pt", True),
                                        ("{workdir}/out/x/*.pt", True), ("ckpt/*.pt", False),
                                        ("outputs/*.pt", False)])
def test_a_scratch_holding_the_checkpoints_is_refused(tmp_path, ck, refused):
    data = dict(BASE, train={"command": "python t.py", "checkpoint": {"path": ck, "every": "1m"}},
                warmup={"command": "python t.py", "scratch": "out"})
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    if refused:
        with pytest.raises(SpecError, match="would delete the job's checkpoints"):
            load_spec(path)
    else:
        assert load_spec(path).warmup.scratch == "out"
