"""Real ``torchrun`` across two nodes through gpujob, on CPU with the gloo backend.

Runs only where an interpreter with torch exists: ``$GPUJOB_TORCH_PYTHON``, else this
interpreter if it imports torch, else ``/opt/torch/.venv/bin/python3``. Elsewhere the
test is skipped *with its reason in the summary* (pytest runs with ``-rs``): it never
passes by skipping. torch is not downloadable on every CI machine (the CPU wheel index
is not PyPI), so the rollback across nodes is covered by tests/local/test_fleet_local.py
(stand-in trainer) and on GPUs by ``python -m bench.fleet --torch`` (BENCHMARKS.md).

The two nodes are two `local` gpujob homes sharing the one interpreter's torch as
their base (base-interpreter profiles: nothing downloaded into either venv).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from helpers import REPO, cli, cli_json


def torch_python() -> str | None:
    for py in (os.environ.get("GPUJOB_TORCH_PYTHON"), sys.executable, "/opt/torch/.venv/bin/python3"):
        if py and Path(py).exists() and subprocess.run(
                [py, "-c", "import torch, torch.distributed.run"], capture_output=True).returncode == 0:
            return py
    return None


TORCH = torch_python()
pytestmark = pytest.mark.skipif(TORCH is None,
                                reason="no interpreter with torch here (set GPUJOB_TORCH_PYTHON): "
                                                     "the real torchrun job across two nodes did not run")


def test_torchrun_over_two_local_nodes_trains_as_one_job_with_a_row_per_node(tmp_path):
    hosts = tmp_path / "hosts.yaml"
    hosts.write_text(yaml.safe_dump({"hosts": {"lab": {"kind": "local", "containers": {
        "n0": {"root": str(tmp_path / "n0")}, "n1": {"root": str(tmp_path / "n1")}}}}}))
    env = dict(os.environ, GPUJOB_HOSTS=str(hosts), XDG_STATE_HOME=str(tmp_path / "state"), COLUMNS="200")
    spec = yaml.safe_load((REPO / "jobs" / "fleet-torch.yaml").read_text())
    spec.update(name="torch-cpu", target=["lab/n0", "lab/n1"], profile="fast")
    spec["sync"][0]["src"] = str(REPO / "jobs" / "fleet_torch")
    spec["nodes"]["env"] = [{"CUDA_VISIBLE_DEVICES": ""}, {"CUDA_VISIBLE_DEVICES": ""}]  # CPU: gloo
    for prof in spec["profiles"]:
        prof.update(python=TORCH, env={"DDP_PRECISION": "fp32"})
    spec["train"]["command"] = spec["train"]["command"].replace(
        "--time-limit 25", "--time-limit 8 --width 128 --layers 2 --batch 4 --seq-len 32 --device cpu")
    spec["throughput"].update(min="1", no_data_timeout="2m", initial_delay="1s")
    del spec["throughput"]["min_ratio"]
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))

    p = cli(["submit", str(path), "--follow"], env, timeout=300)
    out = p.stdout.decode()
    assert p.returncode == 0, (out + p.stderr.decode())[-3000:]
    job_id = [ln for ln in out.splitlines() if ln.startswith("submitted ")][0].split()[1]
    assert "[node 0] " in out and "[node 1] " in out
    for node in ("n0", "n1"):
        log = (tmp_path / node / "jobs" / job_id / "job.log").read_text()
        assert "backend gloo" in log and "done at step" in log, log[-2000:]
    st = cli_json(["status", job_id, "--json"], env)
    assert [n["state"] for n in st["nodes"]] == ["succeeded", "succeeded"], json.dumps(st)[:2000]
    assert [v["job"] for v in cli_json(["ps", "--json"], env)] == [job_id]  # one job, counted once
