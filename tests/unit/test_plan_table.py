"""build_plan (gpujob/ops/plan.py) as a table: one row per spec section that changes what
``submit`` does, and the steps it must then show, in order (tests/local/test_plan_is_run.py
holds the plan to what the supervisor really runs). In-process: a spec on tmp_path, the
`local` kind's target from an inventory, no command run."""

from __future__ import annotations

import pytest
import yaml

from gpujob.inventory.hosts import load_inventory
from gpujob.ops.plan import build_plan
from gpujob.ops.target import Targets
from gpujob.spec.model import load_spec
from helpers import local_env, write_spec

HEAD = ["probe", "ship_agent", "manifest", "submit", "env", "env", "env", "caches", "env"]
WARMUPS = ["warmup", "warmup"]  # warmup.per_gpu: drafter, gpus.drafter [2, 3]: one per GPU
THROUGHPUT = {"format": "ktok", "window": 3, "min": "10K", "failure_limit": 2, "no_data_timeout": "30s",
              "good_after": "1s"}

# id, spec keys (over tests/helpers.py's write_spec), build_plan keywords -> the step kinds in order,
# (kind, a piece of that step's text) that must be there, and a piece no step may show
ROWS = [
    ("base", {}, {}, HEAD + WARMUPS + ["train"],
     ("warmup", "CUDA_VISIBLE_DEVICES=3"), "resuming on purpose"),
    ("no-warmup", {"warmup": None}, {}, HEAD + ["train"], ("train", "within 900s of its start"), "warmup"),
    ("warmup-never", {"warmup": {"command": "python warmup.py", "when": "never"}}, {},
     HEAD + ["warmup", "train"], ("warmup", "never"), "CUDA_VISIBLE_DEVICES"),
    ("no-code", {"sync": []}, {}, [k for k in HEAD if k != "manifest"] + WARMUPS + ["train"],
     ("submit", "no code to ship"), "list the files already shipped"),
    ("clear-caches", {"caches": {"clear_on_submit": True}}, {}, HEAD + WARMUPS + ["train"],
     ("caches", "clear "), "restore the newest snapshot"),
    ("start-timeout", {"throughput": dict(THROUGHPUT, start_timeout="90s")}, {}, HEAD + WARMUPS + ["train"],
     ("train", "within 90s of its start is a start_hang"), "resuming on purpose"),
    ("resume-from", {}, {"resume_from": "ckpt/step-40"}, HEAD + WARMUPS + ["train"],
     ("train", "resuming on purpose from ckpt/step-40"), "no code to ship"),
]


@pytest.fixture(scope="module")
def box(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("plan")
    env = local_env(tmp)
    targets = Targets(load_inventory(env["GPUJOB_HOSTS"]))
    yield tmp, targets.open("box")
    targets.close()


@pytest.mark.parametrize("keys, kw, kinds, has, never", [r[1:] for r in ROWS], ids=[r[0] for r in ROWS])
def test_build_plan(box, keys, kw, kinds, has, never):
    tmp, target = box
    path = write_spec(tmp / "job.yaml", target="box", fast_url="file:///wh/fast", slow_url="file:///wh/slow",
                      **{k: v for k, v in keys.items() if k != "warmup"})
    if "warmup" in keys:  # write_spec's own warmup (per GPU of the drafter) replaced, or none
        data = yaml.safe_load(path.read_text())
        data.pop("warmup")
        if keys["warmup"] is not None:
            data["warmup"] = keys["warmup"]
        path.write_text(yaml.safe_dump(data, sort_keys=False))
    steps = build_plan(load_spec(path), target, "tjob-1", "slow", **kw)
    assert [s.kind for s in steps] == kinds
    kind, piece = has
    assert any(s.kind == kind and piece in f"{s.what} {s.when}" for s in steps), [(s.kind, s.what)
                                                                                  for s in steps]
    assert not any(never in f"{s.what} {s.when}" for s in steps)


def test_the_profile_picks_the_venv_and_the_steps_say_it(box):
    tmp, target = box
    path = write_spec(tmp / "job.yaml", target="box", fast_url="file:///wh/fast", slow_url="file:///wh/slow")
    spec = load_spec(path)
    fast, slow = (build_plan(spec, target, "tjob-1", p) for p in ("fast", "slow"))
    venv = [[s.what for s in steps if s.kind == "env" and s.what.startswith("build venv")]
            for steps in (fast, slow)]
    assert venv[0] and venv[1] and venv[0] != venv[1]
    assert all(w.startswith("build venv fast-") for w in venv[0]) and all(w.startswith("build venv slow-")
                                                                        for w in venv[1])
