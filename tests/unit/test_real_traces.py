"""The judge on real trainers: gpujob replay over the traces recorded on the H200
(tests/data/traces/README.md: HF transformers.Trainer with flex_attention, a
nanoGPT-style trainer, jobs/dflash_mini; a compiled profile and one whose compile
path is broken with TORCHDYNAMO_DISABLE=1; torch 2.11.0+cu130, transformers 5.17.0).

The same pure policy the supervisor runs (agent/judge/replay.py) must roll back no good
profile — HF's save dips to 0.14-0.58 of its rate, nanoGPT's eval gaps, the resumed
bar's climb from 0.59 of the rate over 21 s — and catch every broken-compile run,
within a minute of its first sample. The recordings are about a minute of training
each, so the windows are shorter than docs/rollback.md recommends for multi-day jobs
(30s / 2m): 10 s windows, a 20 s breach, a 1 s recovery tail after a save."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpujob.agent.base import trace
from gpujob.agent.judge.replay import replay_records


def replay_trace(path: str, spec: dict, **kw) -> tuple:
    """The file read here (judge/replay.py takes parsed records)."""
    return replay_records(trace.read_records(path), spec, **kw)

TRACES = Path(__file__).parents[1] / "data" / "traces"
SUMMARY = {json.loads(ln)["name"]: json.loads(ln) for f in ("summary.jsonl", "summary_2lanes.jsonl")
           for ln in (TRACES / f).read_text().splitlines() if ln.strip()}
FORMATS = {
    "hf": {"format": "tqdm", "tokens_per_step": 16384},
    "nanogpt": {"format": "regex", "tokens_per_step": 16384,
                "pattern": r"^iter (?P<step>\d+): loss [0-9.]+, time (?P<ms>[0-9.]+)ms"},
    "dflash": {"format": "ktok"},
}
POLICY = {"window": "10s", "failure_limit": "20s", "min_ratio": 0.5, "good_after": 20.0, "pause_tail": 1.0}

# (trainer, trace, the compiled run whose median is the baseline: same recording, same neighbours)
GOOD = [
    ("hf", "hf_trainer_compiled_2lanes", "hf_trainer_compiled_2lanes"),
    ("hf", "hf_trainer_compiled", "hf_trainer_compiled"),
    ("hf", "hf_trainer_compiled_resume", "hf_trainer_compiled"),
    ("hf", "hf_trainer_rollback_resume_2lanes", "hf_trainer_compiled_2lanes"),  # the ramp after a rollback
    ("nanogpt", "nanogpt_compiled_2lanes", "nanogpt_compiled_2lanes"),
    ("nanogpt", "nanogpt_compiled", "nanogpt_compiled"),
    ("nanogpt", "nanogpt_compiled_resume", "nanogpt_compiled"),
    ("dflash", "dflash_mini_compiled_2lanes", "dflash_mini_compiled_2lanes"),
    ("dflash", "dflash_mini_compiled", "dflash_mini_compiled"),
    ("dflash", "dflash_mini_compiled_resume", "dflash_mini_compiled"),
]
SLOW = [
    ("hf", "hf_trainer_broken_compile_2lanes", "hf_trainer_compiled_2lanes"),
    ("hf", "hf_trainer_broken_compile", "hf_trainer_compiled"),
    ("nanogpt", "nanogpt_broken_compile_2lanes", "nanogpt_compiled_2lanes"),
    ("nanogpt", "nanogpt_broken_compile", "nanogpt_compiled"),
    ("dflash", "dflash_mini_broken_compile_2lanes", "dflash_mini_compiled_2lanes"),
    ("dflash", "dflash_mini_broken_compile", "dflash_mini_compiled"),
]


def _replay(trainer: str, name: str, base: str):
    spec = {"throughput": dict(FORMATS[trainer], **POLICY)}
    return replay_trace(str(TRACES / f"{name}.jsonl.gz"), spec, baseline=SUMMARY[base]["median_tok_s"])


@pytest.mark.parametrize("trainer, name, base", GOOD, ids=[g[1] for g in GOOD])
def test_a_good_profile_is_never_rolled_back(trainer, name, base):
    decisions, summary = _replay(trainer, name, base)
    assert summary["rollbacks"] == 0, [d for d in decisions if d["verdict"] in ("breach", "rollback")][:5]
    assert summary["per_segment"][0]["samples"] >= 30  # the trace was read: its lines gave samples
    if SUMMARY[name]["saves"]:
        assert summary["pauses"] >= 1  # the saves were seen as pauses, not judged


@pytest.mark.parametrize("trainer, name, base", SLOW, ids=[s[1] for s in SLOW])
def test_a_broken_compile_profile_is_caught_within_a_minute_of_its_first_sample(trainer, name, base):
    decisions, summary = _replay(trainer, name, base)
    assert summary["rollbacks"] == 1
    # the slowdown starts with the run (the whole run is slow): detection counts from its first sample
    assert summary["time_to_decide"] <= 60.0, summary
    [rb] = [d for d in decisions if d["verdict"] == "rollback"]
    assert "< " in rb["reason"] and "min_ratio 0.5" in rb["reason"], rb["reason"]


def test_the_hf_save_dips_are_deep_and_only_the_pauses_keep_them_out():
    """What the good-profile test rests on: HF's compiled run dips far below the threshold at
    every save (the issue's 811K -> 360K); those samples fall inside pauses."""
    decisions, summary = _replay("hf", "hf_trainer_compiled_2lanes", "hf_trainer_compiled_2lanes")
    base = SUMMARY["hf_trainer_compiled_2lanes"]["median_tok_s"]
    dips = [d for d in decisions if d.get("value") is not None and d["value"] < 0.5 * base
            and d["verdict"] not in ("settling", "warming_up")]
    assert dips and all(d["verdict"] == "paused" for d in dips), [(d["value"], d["verdict"])
                                                                  for d in dips[:5]]


def test_frequent_saves_are_the_trainers_pace_not_pauses():
    """dflash_mini saves every 10 s here (jobs/dflash-mini.yaml: every 5 s). With a 2 s lead and
    a 5 s tail, a pause would cover 7 s of every 5: on the H200 the job stayed paused and was
    never judged. Saves more frequent than 2 × (lead + tail) open no pause; its shallow dips
    (0.81-1.17 of the median) are then judged as they are, and nothing breaches."""
    from gpujob.agent.judge.pauses import checkpoints_pause
    assert checkpoints_pause(5.0, 5.0) is False and checkpoints_pause(15.0, 5.0) is True
    assert checkpoints_pause(None, 5.0) is True
    spec = {"throughput": dict(FORMATS["dflash"], **dict(POLICY, pause_tail=5.0)),
            "train": {"checkpoint": {"path": "ckpt/step_*.pt", "every": 5.0}}}
    base = SUMMARY["dflash_mini_compiled_2lanes"]["median_tok_s"]
    _, frequent = replay_trace(str(TRACES / "dflash_mini_compiled_2lanes.jsonl.gz"), spec, baseline=base)
    assert frequent["pauses"] == 0 and frequent["rollbacks"] == 0 and frequent["breaches"] == 0
    assert frequent["per_segment"][0]["known_good"] is not None  # judged, and proven
    _, slow = replay_trace(str(TRACES / "dflash_mini_broken_compile_2lanes.jsonl.gz"), spec, baseline=base)
    assert slow["rollbacks"] == 1 and slow["time_to_decide"] <= 60.0


def test_the_supervisors_own_trace_from_the_gpu_replays_to_the_rollback_it_took():
    """bench.gpu act 2 on the H200 through gpujob (2026-12-01, this session's merged judge):
    the supervisor's trace.jsonl.gz and the job's spec (tests/data/traces/gpujob_dflash_mini_act2.*).
    Replayed offline, the policy rolls back at the very moment the live supervisor did, and the
    known-good profile it resumed on is judged good."""
    spec = json.loads((TRACES / "gpujob_dflash_mini_act2.spec.json").read_text())
    decisions, summary = replay_trace(str(TRACES / "gpujob_dflash_mini_act2.jsonl.gz"), spec,
                                      baseline=910000.0)
    slow, fast = [s for s in summary["per_segment"] if s["samples"]]
    assert (slow["profile"], fast["profile"]) == ("slow", "fast")
    assert slow["rollback_at"] is not None and abs(slow["rollback_at"] - slow["recorded_rollback_at"]) < 0.5
    assert fast["rollback_at"] is None and fast["known_good"] > 0.7 * 910000.0
    assert any(d["verdict"] == "note" and "recorded: at" in d["reason"] for d in decisions)


# The supervisors' own traces of act 2 of bench/recipes_gpu on the H200 (2026-12-02): each
# recipe's real trainer through gpujob, broken (TORCHDYNAMO_DISABLE=1) rolled back to compiled,
# with act 1's known-good baseline (BENCHMARKS.md, "Each recipe's real trainer through gpujob").
GPU_ACT2 = {
    "gpujob_hf_act2": 313262.08,             # HF Trainer script, transformers 5.17.0
    "gpujob_nanogpt_act2": 1299286.28,       # nanoGPT-style, before keep_running: the dip restarted it
    "gpujob_nanogpt_act2_kept": 1234664.66,  # the same after it: the dip kept the trainer running
    "gpujob_lightning_act2": 719421.44,      # LightningCLI, lightning 2.6.6
    "gpujob_specforge_act2": 8166.84,        # SpecForge 0.2.0 offline DFlash, the shipped jobs/dflash.yaml
    "gpujob_torchtitan_act2": 217443.0,      # torchtitan 0.2.2 through torchrun (its trace ended whole)
    # 2026-12-05, each spec written by `gpujob init` (bench.recipes_gpu --via-init): init's keys,
    # gpujob's judging defaults, good_after 20s; nanoGPT (recipe rev. 4: out/{job_id}) and HF side
    # by side, Lightning alone (BENCHMARKS.md, "The specs `gpujob init` writes, on the H200")
    "gpujob_h200_1205_init_nanogpt_act2": 1586060.02,
    "gpujob_h200_1205_init_hf_act2": 354222.08,
    "gpujob_h200_1205_init_lightning_act2": 911950.17,
}


@pytest.mark.parametrize("name", sorted(GPU_ACT2))
def test_each_recipes_own_gpu_trace_replays_to_the_rollback_it_took(name):
    spec = json.loads((TRACES / f"{name}.spec.json").read_text())
    _, summary = replay_trace(str(TRACES / f"{name}.jsonl.gz"), spec, baseline=GPU_ACT2[name])
    segs = [s for s in summary["per_segment"] if s["samples"] and s["profile"]]  # (the warmup's: no profile)
    broken, resumed = segs[0], segs[1]
    assert (broken["profile"], resumed["profile"]) == ("broken", "compiled")
    assert (broken["rollback_at"] is not None
            and abs(broken["rollback_at"] - broken["recorded_rollback_at"]) < 0.5)
    assert summary["time_to_decide"] <= 60.0  # caught within a minute of its first sample
    if name.startswith("gpujob_nanogpt"):  # the resumed run's dip under a GPU shared with 3 more lanes
        assert (resumed["rollback_at"] is not None
                and resumed["rollback_at"] == resumed["recorded_rollback_at"])
    else:  # the known-good profile it resumed on was never judged a failure
        assert resumed["rollback_at"] is None and resumed["recorded_rollback_at"] is None
