"""bench.gpu's spec for 1 and several GPUs is a valid gpujob spec, and the run fails
loudly (exit 1, the reason in the JSON) when the base interpreter has no torch.
The GPU run itself happens on the device (see bench/gpu.py)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from bench import gpu
from gpujob.spec.model import load_spec


@pytest.mark.parametrize("gpus, groups", [([0], {"drafter": [0]}),
                                          ([0, 1, 2, 3], {"target": [0], "drafter": [1, 2, 3]})])
def test_spec_for_the_gpu_list(tmp_path, gpus, groups):
    args = gpu.parse_args(["--python", "/opt/torch/.venv/bin/python3", "--gpus", ",".join(map(str, gpus))])
    spec = load_spec(gpu.make_spec(args, tmp_path, gpus, {"cuda": "13.0"}))
    assert spec.gpus == groups and spec.rollback.on[0] == "low_throughput"
    assert all(p.python == "/opt/torch/.venv/bin/python3" and p.system_site_packages and not p.packages
               for p in spec.profiles)
    assert spec.train.checkpoint.every == 5 and spec.rollback.wait_for_checkpoint


def test_the_example_spec_loads():
    spec = load_spec(gpu.REPO / "jobs" / "dflash-mini.yaml")
    assert [p.name for p in spec.profiles] == ["fast", "slow"]
    assert spec.throughput.resume_initial_delay == 1


def test_no_torch_fails_loudly(tmp_path):
    out = tmp_path / "g.json"
    p = subprocess.run([sys.executable, "-m", "bench.gpu", "--python", sys.executable, "--out", str(out)],
                       capture_output=True, text=True, cwd=gpu.REPO, timeout=120)
    assert p.returncode == 1 and "bench.gpu: FAILED:" in p.stderr
    data = json.loads(out.read_text())
    assert data["status"] == "failed" and "cannot import torch" in data["error"]
