"""Base-interpreter profiles: a venv built on another interpreter that is itself a
venv (as /opt/torch/.venv/bin/python3 on GPU images), seeing its packages; the
profile's own pins still win; pins and cuda: are verified against what the venv
imports. Real uv, real venvs, wheels built on disk; no network."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from gpujob.agent.base import envs
from gpujob.ops.target import agent_zip, uv_binary
from gpujob.ops.wheelhouse import build_indexes, build_wheel

FAKE_TORCH = "class version:\n    cuda = '13.0'\n"


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """A base venv holding demo-kernels 1.0.0+slow, demo-extra 2.0 and a fake torch."""
    root = tmp_path_factory.mktemp("base")
    uv = str(uv_binary())
    wheels = [build_wheel(root / "w", "slow", 4300.0),
              build_wheel(root / "w", "", 1.0, "2.0", package="gpujob-demo-extra", module="demo_extra"),
              build_wheel(root / "w", "cu130", 1.0, "2.11.0", package="torch", module="torch",
                          body=FAKE_TORCH)]
    subprocess.run([uv, "venv", "--python", sys.executable, str(root / "venv")], check=True,
                   capture_output=True)
    subprocess.run([uv, "pip", "install", "--python", str(root / "venv" / "bin" / "python"),
                    "--no-index", *map(str, wheels)], check=True, capture_output=True)
    return {"python": str(root / "venv" / "bin" / "python"), "index": build_indexes(root / "idx")}


def run_job(tmp_path, profile: dict, train: str) -> tuple[dict, str, dict]:
    home = tmp_path / "home"
    (home / "bin").mkdir(parents=True)
    agent = home / "bin" / "agent.pyz"
    agent.write_bytes(agent_zip()[0])
    spec = {"name": "basejob", "profiles": [profile], "train": {"command": train, "resume_args": []}}
    job = {"job_id": "basejob-aaaa", "spec": spec, "profile": profile["name"],
           "env_keys": {profile["name"]: "p-0"}, "spec_hash": "basejob", "uv": str(uv_binary()),
           "sync_streams": []}
    r = subprocess.run([sys.executable, str(agent), "--home", str(home), "submit"],
                       input=json.dumps(job).encode() + b"\n", capture_output=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    jdir = home / "jobs" / "basejob-aaaa"
    for _ in range(600):
        st = json.loads((jdir / "state.json").read_text())
        if st["state"] in ("succeeded", "failed"):
            break
        time.sleep(0.1)
    marker = home / "envs" / "p-0" / envs.OK_MARKER
    return st, (jdir / "job.log").read_text(), json.loads(marker.read_text()) if marker.exists() else {}


def test_profile_inherits_the_base_and_overrides_its_own_pin(tmp_path, base):
    profile = {"name": "p", "python": base["python"], "system_site_packages": True, "cuda": "13.0",
               "index_url": base["index"]["fast"].as_uri(),
               "packages": ["gpujob-demo-kernels==1.0.0+fast"]}
    st, log, marker = run_job(tmp_path, profile, "python -c 'import demo_kernels, demo_extra, torch; "
                              "print(\"IMPORTED\", demo_kernels.BUILD, demo_extra.__version__, "
                              "torch.__version__)'")
    assert st["state"] == "succeeded", log[-3000:]
    assert "IMPORTED fast 2.0 2.11.0+cu130" in log  # own pin wins; the rest from the base
    assert marker["packages"] == {"gpujob-demo-kernels": "1.0.0+fast", "torch": "2.11.0+cu130"}
    assert marker["from"]["gpujob-demo-kernels"] == "venv"
    assert "base" in marker["from"]["torch"]  # torch came from the base venv's site-packages
    assert marker["torch"]["cuda"] == "13.0"
    assert f"venv --python {base['python']} --system-site-packages" in log


def test_empty_profile_on_the_base_and_a_wrong_cuda_fail_verification(tmp_path, base):
    profile = {"name": "p", "python": base["python"], "system_site_packages": True, "cuda": "12.8",
               "packages": []}
    st, log, marker = run_job(tmp_path, profile, "true")
    assert st["state"] == "failed"
    assert "torch.version.cuda is 13.0, the profile says 12.8" in st["reason"]
    assert marker == {}  # a venv that fails its check is removed


def test_empty_base_profile_builds_without_an_index(tmp_path, base):
    profile = {"name": "p", "python": base["python"], "system_site_packages": True, "packages": []}
    st, log, _ = run_job(tmp_path, profile,
                         "python -c 'import demo_kernels; print(\"BUILD\", demo_kernels.BUILD)'")
    assert st["state"] == "succeeded", log[-3000:]
    assert "BUILD slow" in log and "pip install" not in log


def test_build_commands_for_a_base_profile():
    prof = {"name": "b", "python": "/opt/torch/.venv/bin/python3", "system_site_packages": True,
            "packages": []}
    cmds = envs.build_commands(prof, "/h/envs/k", "/usr/bin/python3", uv="uv", uv_cache="/h/uvc",
                               common_requirements=[])
    assert cmds[0] == ["uv", "venv", "--python", "/opt/torch/.venv/bin/python3", "--system-site-packages",
                       "--cache-dir", "/h/uvc", "/h/envs/k"]
    assert cmds[1][0] == "/opt/torch/.venv/bin/python3" and cmds[1][-1] == "/h/envs/k"
    assert len(cmds) == 2  # nothing to install
    assert envs.venv_python({"name": "x"}, "/agent/python") == "/agent/python"
    pip = envs.build_commands(prof, "/h/envs/k", "/usr/bin/python3", uv=None, uv_cache="/h/uvc",
                              common_requirements=[])
    assert pip[0] == ["/opt/torch/.venv/bin/python3", "-m", "venv", "--system-site-packages", "--without-pip",
                      "/h/envs/k"]
