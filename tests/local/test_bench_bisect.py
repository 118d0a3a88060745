"""bench/bisect_gpu.py (the GPU run of `gpujob bisect`) builds a valid spec and index and plans
its trials without torch or a GPU (`--plan` runs nothing), so its code cannot rot."""

from __future__ import annotations

import subprocess
import sys

import pytest

from helpers import REPO


@pytest.mark.parametrize("device, culprit", [("cuda", "env TORCHDYNAMO_DISABLE (none) -> 1"),
                                             ("cpu", "env DFLASH_CPU_STEP_DELAY (none) -> 0.05")])
def test_the_gpu_bisect_plans_one_slow_env_among_five_harmless_pins(tmp_path, device, culprit):
    p = subprocess.run([sys.executable, "-m", "bench.bisect_gpu", "--device", device, "--plan",
                        "--workdir", str(tmp_path)], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert "bisect good -> bad: 6 changes; one culprit takes at most 5 trials" in p.stdout
    assert f"6. {culprit}" in p.stdout and "1. bis-a 1.0 -> 2.0" in p.stdout
    assert "trial 1 (the good profile): job dflash-mini-bisect-xxxx" in p.stdout
    assert not (tmp_path / "root" / "jobs").exists()  # planned, nothing ran
