"""What each recipe sets for the judge (fast, no bed), and that the agent really reads
each of those keys: the spec is loaded as `submit` loads it, turned into job.json's
spec (to_agent_dict), and fed to the supervisor's own pieces (the line source, the
pauses, the checkpoint register, the resume substitution) as they run it."""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path

import pytest
import yaml

from gpujob.agent.home import ckregister
from gpujob.agent.base.placeholders import substitute
from gpujob.agent.judge.replay import replay_records
from gpujob.errors import SpecError
from gpujob.spec.recipes.registry import PRELOAD, RECIPES, describe
from gpujob.spec.model import load_spec

REVISIONS = Path(__file__).parents[1] / "data" / "recipes" / "revisions.json"
BASE = {"name": "j", "target": "box", "profiles": [{"name": "base", "system_site_packages": True}]}


def agent_spec(tmp_path: Path, recipe: str, command: str, **extra) -> tuple:
    data = {**BASE, "recipe": recipe, "train": {"command": command}, "throughput": {"min_ratio": 0.8}}
    for key, value in extra.items():
        data[key] = {**data.get(key, {}), **value} if isinstance(value, dict) else value
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    spec = load_spec(path)
    return spec, spec.to_agent_dict()


# recipe -> (command, tokens given, what it must set: dotted key -> value)
SETS = {
    "specforge": ("python -m specforge.cli train -c run.yaml output_dir={workdir}/out run_id=r", 512, {
        "throughput.ranks": "first", "train.checkpoint.path": "out/{job_id}/r-step*",
        "train.checkpoint.done_file": "training_state.pt",
        "train.resume_args": ["training.resume_from={resume_from}"]}),
    "hf_trainer": ("python run_clm.py --output_dir out --per_device_train_batch_size 2 --max_seq_length 64",
                   None, {
        "train.checkpoint.path": "out/{job_id}/checkpoint-*",
        "train.checkpoint.done_file": "trainer_state.json",
        "train.resume_args": ["--resume_from_checkpoint", "{resume_from}"],
        "throughput.pause_pattern": r"^\{'eval_loss'", "throughput.tokens_per_step": 128}),
    "nanogpt": ("python train.py --batch_size=4 --block_size=256 --gradient_accumulation_steps=2", None, {
        "throughput.format": "regex", "throughput.tokens_per_step": 2048,
        "throughput.pattern": r"^iter (?P<step>\d+): loss [0-9.]+, time (?P<ms>[0-9.]+)ms",
        "throughput.pause_pattern": r"^step \d+: train loss", "train.checkpoint.settle": "5s"}),
    "torchtitan": ("torchrun --nproc_per_node 2 -m torchtitan.train --job.dump_folder out", None, {
        "throughput.ranks": "first", "train.checkpoint.path": "out/checkpoint/{job_id}/step-*",
        "train.checkpoint.done_file": ".metadata"}),
    "lightning": ("python main.py fit", 1000, {
        "train.checkpoint.settle": "1s", "train.resume_args": ["--ckpt_path", "{resume_from}"],
        "train.command": "python main.py fit --trainer.callbacks+=TQDMProgressBar"}),
}


@pytest.mark.parametrize("recipe", sorted(SETS))
def test_each_recipe_sets_the_keys_its_trainer_fixes(tmp_path, recipe):
    command, tokens, want = SETS[recipe]
    extra = {"throughput": {"tokens_per_step": tokens}} if tokens else {}
    spec, _ = agent_spec(tmp_path, recipe, command, **extra)
    came = spec._layers["recipe"]
    for key, value in want.items():
        assert came.get(key) == value, (key, came.get(key))  # and --plan marks it: it came from the recipe
    assert set(RECIPES) == set(SETS)


def lines(t0: float, texts: list, dt: float = 0.5) -> list:
    return [{"t": 0.0, "run": {"profile": "p", "phase": "train"}}] + \
        [{"t": t0 + i * dt, "out": text} for i, text in enumerate(texts)]


def test_the_agent_reads_each_recipes_rate_keys(tmp_path):
    """ranks first (one sample of a step's per-rank lines), the ms group with tokens per
    iteration, and the eval lines (pause_pattern) that pause judging."""
    _, sf = agent_spec(tmp_path, "specforge", SETS["specforge"][0], throughput={"tokens_per_step": 512})
    recs = lines(1.0, [f"[rank{r}]: step {s}: {{'loss': 1.0, 'perf/global_samples_per_second': 2.0}}"
                       for s in range(1, 9) for r in range(2)], dt=0.25)
    decisions, summary = replay_records(recs, sf)
    assert summary["per_segment"][0]["samples"] == 8  # two ranks, one sample a step: the first rank's
    assert decisions and {d["value"] for d in decisions if d["value"]} == {2.0 * 512}
    _, ng = agent_spec(tmp_path, "nanogpt", SETS["nanogpt"][0])
    recs = lines(1.0, [f"iter {i}: loss 2.0000, time 500.00ms, mfu 1.00%" for i in range(10)]
                 + ["step 10: train loss 2.0000, val loss 2.1000",
                    "iter 10: loss 2.0, time 9000.00ms, mfu 1.00%"])
    decisions, summary = replay_records(recs, ng)
    assert summary["per_segment"][0]["samples"] == 11 and summary["pauses"] == 1
    assert {d["value"] for d in decisions if d["value"]} <= {2048 / 0.5, 2048 / 9.0}
    _, hf = agent_spec(tmp_path, "hf_trainer", SETS["hf_trainer"][0])
    recs = lines(1.0, [f" {i}/100 [00:01<00:10,  2.00it/s]" for i in range(1, 6)]
                 + [" 1/2 [00:00<00:00, 80.00it/s]", "", "{'eval_loss': 1.25, 'epoch': 0.5}"])
    _, summary = replay_records(recs, hf)
    assert summary["pauses"] == 1
    _, tt = agent_spec(tmp_path, "torchtitan", SETS["torchtitan"][0])
    assert tt["throughput"]["ranks"] == "first"
    recs = lines(1.0, [f"[rank{r}]:[titan] step: {s}  loss:  2.0  memory: 1GiB(1%)  tps: {1000 + r:,}  mfu: "
                       f"1%"
                       for s in range(1, 5) for r in range(2)])
    decisions, summary = replay_records(recs, tt)
    assert summary["per_segment"][0]["samples"] == 4 and all(d["value"] in (1000, None) for d in decisions)


@pytest.mark.parametrize("recipe", ["specforge", "hf_trainer", "torchtitan"])
def test_a_directory_checkpoint_is_finished_by_its_done_file_and_resumed_by_path(tmp_path, recipe):
    command, tokens, _ = SETS[recipe]
    extra = {"throughput": {"tokens_per_step": tokens}} if tokens else {}
    _, job = agent_spec(tmp_path, recipe, command, **extra)
    ck = job["train"]["checkpoint"]
    work = tmp_path / "work"
    home = str(tmp_path / "home")
    w = ckregister.CkWatch.begin(home, "j-1", "j", "base", str(work / ck["path"].replace("{job_id}", "j-1")),
                                 str(work), True, ck["settle"], ck["done_file"], time.time())
    step = ck["path"].replace("*", "12").replace("{job_id}", "j-1")
    (work / step).mkdir(parents=True)
    (work / step / "weights.bin").write_text("w")
    t = time.time()
    w.poll(t + 1, force=True)
    w.poll(t + 100, force=True)  # long settled, but its done_file is not there: not finished
    assert w.newest_own(t + 100)["file"] is None
    (work / step / ck["done_file"]).write_text("{}")
    w.poll(t + 101, force=True)  # the done file's own arrival: not yet quiet
    assert w.newest_own(t + 101)["file"] is None
    w.poll(t + 101 + ck["settle"], force=True)
    assert w.newest_own(t + 101 + ck["settle"])["file"] == str(work / step)
    args = [substitute(a, {"resume_from": str(work / step)}) for a in job["train"]["resume_args"]]
    assert str(work / step) in " ".join(args)


@pytest.mark.parametrize("recipe,settle", [("nanogpt", 5.0), ("lightning", 1.0)])
def test_a_file_written_in_place_is_finished_after_the_recipes_settle(tmp_path, recipe, settle):
    """nanoGPT rewrites out/ckpt.pt in place (5 s unchanged: finished); Lightning writes each
    .ckpt in one go from a buffer and never again, under a new name every save (1 s: a fast run
    saves every few seconds and deletes the one before, so 5 s never finished one)."""
    command, tokens, _ = SETS[recipe]
    extra = {"throughput": {"tokens_per_step": tokens}} if tokens else {}
    _, job = agent_spec(tmp_path, recipe, command, **extra)
    ck = job["train"]["checkpoint"]
    assert ck["settle"] == settle
    work = tmp_path / "work"
    w = ckregister.CkWatch.begin(str(tmp_path / "home"), "j-1", "j", "base", str(work / ck["path"]),
                                 str(work), True, ck["settle"], ck.get("done_file"), time.time())
    f = work / ck["path"].replace("version_*", "version_0").replace("*.ckpt", "epoch=0-step=2.ckpt")
    f.parent.mkdir(parents=True)
    f.write_text("half")
    t = os.stat(f).st_mtime
    w.poll(t + 0.1, force=True)
    w.poll(t + settle * 0.6, force=True)  # not yet quiet for settle
    assert w.newest_own(t + settle * 0.6)["file"] is None
    w.poll(t + settle + 0.5, force=True)
    assert w.newest_own(t + settle + 0.5)["file"] == str(f)


def test_rate_and_checkpoint_keys_yield_with_the_spec_own(tmp_path):
    # the spec reads its rate another way: the recipe's format, pattern and tokens go
    spec, _ = agent_spec(tmp_path, "nanogpt", "python train.py", throughput={"format": "ktok"})
    assert spec.throughput.pattern is None and spec.throughput.tokens_per_step is None
    # its eval line pauses whatever reads the rate
    assert spec.throughput.pause_pattern == r"^step \d+: train loss"
    spec, _ = agent_spec(tmp_path, "lightning", "python main.py fit", throughput={"format": "ktok"})
    assert spec.throughput.format == "ktok"  # no tokens_per_step required of it
    # checkpoint: null takes the {resume_from} resume_args with it
    spec, _ = agent_spec(tmp_path, "lightning", "python main.py fit", throughput={"tokens_per_step": 10},
                         train={"command": "python main.py fit", "checkpoint": None})
    assert spec.train.checkpoint is None and spec.train.resume_args == []
    # nanoGPT with a config file: its values are not read, so tokens per iteration is required
    with pytest.raises(SpecError,
                       match="tokens_per_step: missing .required. for recipe nanogpt: a config file"):
        agent_spec(tmp_path, "nanogpt", "python train.py config/train_gpt2.py --batch_size=8")
    spec, _ = agent_spec(tmp_path, "nanogpt", "python train.py config/x.py --batch_size=8 --block_size=64 "
                         "--gradient_accumulation_steps=1")
    assert spec.throughput.tokens_per_step == 512


def test_standby_preloads_only_for_commands_the_standby_runs(tmp_path):
    spec, _ = agent_spec(tmp_path, "specforge", SETS["specforge"][0], throughput={"tokens_per_step": 1})
    assert spec.train.standby.preload == PRELOAD["specforge"]
    assert {"specforge.cli", "torch._inductor.compile_fx"} <= set(PRELOAD["specforge"])
    spec, _ = agent_spec(tmp_path, "specforge", "specforge train -c run.yaml",
                         throughput={"tokens_per_step": 1})
    assert spec.train.standby is None  # a console script: the standby cannot run it
    spec, _ = agent_spec(tmp_path, "torchtitan", SETS["torchtitan"][0])
    assert spec.train.standby is None  # torchrun's workers are fresh processes
    for recipe in ("hf_trainer", "nanogpt", "lightning"):
        command, tokens, _ = SETS[recipe]
        extra = {"throughput": {"tokens_per_step": tokens}} if tokens else {}
        spec, _ = agent_spec(tmp_path, recipe, command, **extra)
        assert spec.train.standby.preload == PRELOAD[recipe] and spec.train.standby.preload[0] == "torch"


def fingerprint(name: str) -> str:
    return hashlib.sha256(json.dumps(describe(name)["sets"], sort_keys=True).encode()).hexdigest()[:16]


def test_a_recipes_keys_never_change_within_a_revision():
    """job.json records the recipe's revision: the same revision must mean the same keys,
    so a resubmit after a gpujob upgrade never changes silently. A change of what a recipe
    sets needs a new revision (and its fingerprint added to tests/data/recipes/revisions.json;
    an old revision's is never edited)."""
    known = json.loads(REVISIONS.read_text())
    for name, r in RECIPES.items():
        revs = known[name]
        assert max(int(k) for k in revs) == r.revision, \
            f"{name}: revision {r.revision} is not the newest recorded"
        assert revs[str(r.revision)] == fingerprint(name), \
            f"recipe {name}'s keys changed within revision {r.revision}: bump its revision"
        assert len(set(revs.values())) == len(revs)  # each revision changed something


def test_lightning_gets_a_bar_that_prints_into_a_pipe_and_a_warmup_lightning_accepts(tmp_path):
    """Found running Lightning 2.6.6: with rich installed its default bar draws nothing into
    a pipe until the run ends (no samples), and `--trainer.enable_checkpointing false` is
    refused beside a configured ModelCheckpoint (the warmup died before its first step)."""
    cmd = "python main.py fit --trainer.callbacks+=ModelCheckpoint --trainer.callbacks.every_n_train_steps=50"
    spec, _ = agent_spec(tmp_path, "lightning", cmd, throughput={"tokens_per_step": 10})
    assert spec.train.command == cmd + " --trainer.callbacks+=TQDMProgressBar"
    assert "enable_checkpointing" not in spec.warmup.command
    assert spec.warmup.command.startswith(spec.train.command)  # the warmup draws the same bar
    own = "python main.py fit --trainer.callbacks+=RichProgressBar"  # a bar of the user's own: left alone
    spec, _ = agent_spec(tmp_path, "lightning", own, throughput={"tokens_per_step": 10})
    assert spec.train.command == own
