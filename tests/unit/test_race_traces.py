"""The seeds' compile race as recorded on the H200 (tests/data/traces/race_*; torch
2.11.0+cu130, 3 threads compiling flex_attention with create_block_mask): what gpujob's
classification makes of those real outputs. Recorded by bench/traces/record_traces.py."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from gpujob.agent.supervisor import hang, stacks
from gpujob.agent.judge import signals
from gpujob.agent.base.protocol import FailureSignal as F
from gpujob.spec.model import Rollback

TRACES = Path(__file__).parents[1] / "data" / "traces"
SIGS = Rollback().error_signatures  # the spec's default signatures


def _read(name: str) -> tuple:
    recs = [json.loads(ln) for ln in gzip.open(TRACES / name, "rt") if ln.strip()]
    start = next(r["t"] for r in recs if "run" in r)
    outs = [(r["t"] - start, r["out"]) for r in recs if "out" in r]
    code = next(r["exit"] for r in recs if "exit" in r)
    return outs, code


COLD = sorted(p.name for p in TRACES.glob("race_cold_3threads_*.jsonl.gz")) + \
    sorted(p.name for p in TRACES.glob("race_restart_*.jsonl.gz"))
WARM = sorted(p.name for p in TRACES.glob("race_warm_3threads_*.jsonl.gz"))


def test_the_recordings_are_there():
    assert len(COLD) >= 9 and len(WARM) >= 8


@pytest.mark.parametrize("name", COLD)
def test_a_cold_cache_race_hangs_silently_and_is_named_a_compile_race_with_its_stacks(name):
    outs, code = _read(name)
    # one banner line, then nothing until the recorder's SIGABRT (at its timeout): no sample, no error line
    abort = next(t for t, o in outs if o.startswith("Fatal Python error: Aborted"))
    assert abort >= 30
    quiet = [o for t, o in outs if t < abort]
    assert len(quiet) == 1 and quiet[0].startswith("compile_race: torch 2.11.0+cu130, threads 3"), quiet
    assert code == -6 and not any(signals.scan_line(o, SIGS) for o in quiet)
    # what gpujob does at start_timeout on a cache that was empty at the start: compile_race
    name_, reason, ev = hang.start_hang("train", 60.0, 60.0, cold_cache=True)
    assert name_ == F.COMPILE_RACE and ev["hung"]
    # and what the SIGABRT (PYTHONFAULTHANDLER=1) leaves in the log: every thread's stack,
    # the compiling ones inside inductor
    text = stacks.faulthandler_blocks("\n".join(o for t, o in outs if t >= abort))
    assert text.startswith("Fatal Python error: Aborted")
    assert text.count("Thread 0x") >= 4 and "torch/_inductor" in text


@pytest.mark.parametrize("name", WARM)
def test_a_warm_cache_race_fails_with_the_fx_error_and_is_a_compile_race(name):
    outs, code = _read(name)
    lines = [o for _, o in outs]
    hits = [o for o in lines if signals.scan_line(o, SIGS)]
    if code == 0:
        assert not hits  # every thread compiled: nothing to say
        return
    assert hits and all(signals.scan_line(o, SIGS) == F.COMPILE_RACE for o in hits), hits
    failure, reason = signals.classify_exit(code, None, lines, SIGS)
    assert failure == F.COMPILE_RACE and "Detected that you are using FX to symbolically trace" in reason
