"""A rollback onto a standby interpreter, per single-process recipe (the standby runs
`python SCRIPT` / `python -m MODULE`; torchtitan's torchrun is out), on the `local` kind
with the CPU stand-ins of tests/data/recipes/standin.py. Act 1 makes `fast` known-good;
act 2 starts on `slow`, and the rollback hands the trainer to the standby of `fast` that
was waiting: the test checks that hand-over and that the rollback's timings are recorded
in order, never their seconds (the suite runs on a loaded machine).

The figure, decision -> first good sample within 5 s, is a benchmark's:
`python -m bench.recipes_standby` runs this file with RECIPE_FIGURES=FILE, which appends
each run's figures as JSON lines and runs act 2 once more without the standby, and
checks the goal (BENCHMARKS.md: CPU stand-in figures, not a GPU's)."""

from __future__ import annotations

import json
import os
import time

import pytest

from helpers import cli, events, job_id_of, local_env, wait_for
from test_jobs_local import journal, status
from test_recipes_local import CASES, recipe_spec

# what the stand-in imports (the recipes' torch etc. are not here)
PRELOAD = "train.standby.preload=[pydantic]"


def act2(spec, env, tmp_path, recipe, *sets):
    p = cli(["submit", str(spec), "--follow", *sets], env, timeout=180)
    assert p.returncode == 0, p.stdout.decode()[-3000:] + p.stderr.decode()[-2000:]
    job_id = job_id_of(p.stdout)
    st = status(job_id, env)
    [rb] = st["rollbacks"]
    ev = events(journal(tmp_path, job_id))
    return rb, ev


@pytest.mark.parametrize("recipe", sorted(r for r in CASES if r != "torchtitan"))
def test_rollback_onto_the_standby_gives_a_good_sample(tmp_path, recipe):
    env = local_env(tmp_path)
    _, command, tokens, _ = CASES[recipe]
    spec = recipe_spec(tmp_path / "job.yaml", recipe, command, tokens)
    # act 1: fast trains until it is known-good (then stopped)
    one = job_id_of(cli(["submit", str(spec), "--profile", "fast", "--set", "env={STANDIN_STEPS: '5000'}",
                         "--set", PRELOAD], env, check=True).stdout)
    ended = ("succeeded", "failed", "stopped")
    wait_for(lambda: any(e["type"] == "known_good" for e in events(journal(tmp_path, one)))
             or status(one, env)["state"] in ended, 90, what="fast known-good or act 1's end")
    ev1 = events(journal(tmp_path, one))
    assert any(e["type"] == "known_good" for e in ev1), \
        [(e["type"], e.get("verdict"), e.get("reason")) for e in ev1
         if e["type"] in ("decision", "pause", "exit")]
    cli(["stop", one], env, check=True)
    wait_for(lambda: status(one, env)["state"] in ("stopped", "succeeded"), 60, what="act 1 stopped")
    # act 2: slow, rolled back onto the waiting standby of fast
    rb, ev = act2(spec, env, tmp_path, recipe, "--set", PRELOAD)
    started = next(e for e in ev if e["type"] == "standby_started")
    assert started["profile"] == "fast" and started["preload"] == ["pydantic"]
    assert any(e["type"] == "standby_used" and e["profile"] == "fast" for e in ev)
    marks = rb["timings"]
    # the fast profile's trainer on the standby: started, sampled, good, in that order from the decision
    order = ["trainer_start", "first_sample", "first_good"]
    assert all(k in marks for k in order), marks
    assert [marks[k] for k in order] == sorted(marks[k] for k in order), marks
    # a rollback that comes while a save settles lets it finish first (train.checkpoint.save_wait: at
    # most the recipe's settle, 5 s for an in-place .ckpt): that wait is the checkpoint's, not the restart's
    waited = sum(e["waited"] for e in ev if e["type"] == "save_waited")
    out = os.environ.get("RECIPE_FIGURES")
    if out:
        rb2, ev2 = act2(spec, env, tmp_path, recipe, "--set", "train.standby=null")
        assert not any(e["type"] == "standby_used" for e in ev2)
        with open(out, "a") as f:
            f.write(json.dumps({"recipe": recipe, "at": time.time(), "standby": marks, "save_waited": waited,
                                "no_standby": rb2["timings"],
                                "no_standby_save_waited": sum(e["waited"] for e in ev2
                                                              if e["type"] == "save_waited")}) + "\n")
