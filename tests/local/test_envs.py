"""Wheel profiles as venvs: the pure command builders and pin checks, and the pip
fallback of the supervisor (for a container where uv cannot run)."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import tarfile
import time

from gpujob.agent.base import envs
from gpujob.ops.target import agent_zip
from gpujob.ops.wheelhouse import build_indexes
from helpers import TRAINER_DIR

PROFILE = {"name": "cu130", "index_url": "https://download.pytorch.org/whl/cu130",
           "extra_index_urls": ["https://extra/simple"],
           "packages": ["torch==2.11.0+cu130", "torchvision==0.26.0+cu130"], "cuda": "13.0"}


def test_uv_commands_pin_from_the_profile_index_and_constrain_common_requirements():
    cmds = envs.build_commands(PROFILE, "/h/envs/k", "python3", uv="/h/bin/uv", uv_cache="/h/uv-cache",
                               common_requirements=["transformers==4.57.1"], constraints_file="/h/c.txt")
    assert cmds[0] == ["/h/bin/uv", "venv", "--python", "python3", "--cache-dir", "/h/uv-cache", "/h/envs/k"]
    assert cmds[1][-4:] == ["--extra-index-url", "https://extra/simple", "torch==2.11.0+cu130",
                            "torchvision==0.26.0+cu130"]
    assert cmds[1][cmds[1].index("--index-url") + 1] == PROFILE["index_url"]
    assert "--index-url" not in cmds[2]  # common requirements: PyPI plus the profile's index
    assert cmds[2][cmds[2].index("-c") + 1] == "/h/c.txt" and cmds[2][-1] == "transformers==4.57.1"


def test_pip_fallback_commands():
    cmds = envs.build_commands(PROFILE, "/h/envs/k", "python3", uv=None, uv_cache="/h/uv-cache",
                               common_requirements=[])
    assert cmds[0] == ["python3", "-m", "venv", "/h/envs/k"]
    assert cmds[1][:3] == ["/h/envs/k/bin/python", "-m", "pip"] and len(cmds) == 2


def test_check_verify_compares_pins_and_torch_cuda():
    good = {"packages": {"torch": "2.11.0+cu130", "torchvision": "0.26.0+cu130"},
            "torch": {"version": "2.11.0+cu130", "cuda": "13.0"}}
    assert envs.check_verify(PROFILE, good) == []
    bad = {"packages": {"torch": "2.11.0+cu128", "torchvision": None},
           "torch": {"version": "2.11.0+cu128", "cuda": "12.8"}}
    problems = envs.check_verify(PROFILE, bad)
    assert "torch is 2.11.0+cu128, the profile pins 2.11.0+cu130" in problems
    assert "torchvision is not installed" in problems
    assert "torch.version.cuda is 12.8, the profile says 13.0" in problems
    assert envs.pin_of("Torch_Vision[extra]==0.26.0+cu130") == ("torch-vision", "0.26.0+cu130")


def test_supervisor_builds_with_pip_when_there_is_no_uv(tmp_path):
    idx = build_indexes(tmp_path / "index")
    home = tmp_path / "home"
    (home / "bin").mkdir(parents=True)
    agent = home / "bin" / "agent.pyz"
    agent.write_bytes(agent_zip()[0])
    spec = {"name": "pipjob", "profiles": [{"name": "fast", "index_url": idx["fast"].as_uri(),
                                            "packages": ["gpujob-demo-kernels==1.0.0+fast"]}],
            "train": {"command": "python trainer.py --steps 2 --interval 0.01", "resume_args": []}}
    job = {"job_id": "pipjob-aaaa", "spec": spec, "profile": "fast", "env_keys": {"fast": "fast-0"},
           "spec_hash": "h", "uv": None}
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        tar.add(TRAINER_DIR / "trainer.py", "trainer.py")
    job["sync_streams"] = [{"dest": ".", "size": len(buf.getvalue())}]
    argv = [sys.executable, str(agent), "--home", str(home)]
    r = subprocess.run(argv + ["submit"], input=json.dumps(job).encode() + b"\n" + buf.getvalue(),
                       capture_output=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    state = home / "jobs" / "pipjob-aaaa" / "state.json"
    for _ in range(600):
        st = json.loads(state.read_text())
        if st["state"] in ("succeeded", "failed"):
            break
        time.sleep(0.1)
    assert st["state"] == "succeeded", (home / "jobs" / "pipjob-aaaa" / "job.log").read_text()[-2000:]
    log = (home / "jobs" / "pipjob-aaaa" / "job.log").read_text()
    assert "no uv in the container, installing with pip" in log and "-m pip install" in log
    marker = json.loads((home / "envs" / "fast-0" / envs.OK_MARKER).read_text())
    assert marker["installer"] == "pip" and marker["packages"] == {"gpujob-demo-kernels": "1.0.0+fast"}


def test_find_links_go_to_both_install_steps():
    prof = dict(PROFILE, find_links=["file:///opt/wheels", "https://example.org/wheels.html"])
    for uv in ("/h/bin/uv", None):
        cmds = envs.build_commands(prof, "/h/envs/k", "python3", uv=uv, uv_cache="/h/uv-cache",
                                   common_requirements=["transformers==4.57.1"], constraints_file="/h/c.txt")
        for step in cmds[1:]:
            got = [step[i + 1] for i, a in enumerate(step) if a == "--find-links"]
            assert got == prof["find_links"], step
    assert "--find-links" not in sum(envs.build_commands(PROFILE, "/h/envs/k", "python3", uv="/h/bin/uv",
                                                         uv_cache="/h/uv-cache", common_requirements=[]), [])


def test_relative_find_links_start_at_the_spec_folder(tmp_path):
    from gpujob.ops.plan import job_request
    from gpujob.spec.model import load_spec
    (tmp_path / "job.yaml").write_text(
        "name: fl\nprofiles:\n  - {name: a, index_url: 'file:///opt/pypi/simple', find_links: ['file:wheels',"
        " 'file:///opt/wheels'], packages: [x==1]}\ntrain: {command: t}\n")
    spec = load_spec(tmp_path / "job.yaml")
    prof = job_request(spec, "fl-1", "a", clear_caches=False).spec["profiles"][0]
    assert prof["find_links"] == [(tmp_path / "wheels").as_uri(), "file:///opt/wheels"]


def test_supervisor_installs_a_wheel_found_only_through_find_links(tmp_path):
    """uv really takes the pin from a plain folder of wheels: the profile's index is empty."""
    from gpujob.ops.target import uv_binary
    from gpujob.ops.wheelhouse import build_wheel
    uv = uv_binary()
    assert uv is not None
    build_wheel(tmp_path / "flat", "fast", 12800.0)
    empty = tmp_path / "empty-index"
    empty.mkdir()
    (empty / "index.html").write_text("<!DOCTYPE html><html><body></body></html>\n")
    home = tmp_path / "home"
    (home / "bin").mkdir(parents=True)
    agent = home / "bin" / "agent.pyz"
    agent.write_bytes(agent_zip()[0])
    spec = {"name": "fljob", "profiles": [{"name": "fast", "index_url": empty.as_uri(),
                                           "find_links": [(tmp_path / "flat").as_uri()],
                                           "packages": ["gpujob-demo-kernels==1.0.0+fast"]}],
            "train": {"command": "python trainer.py --steps 2 --interval 0.01", "resume_args": []}}
    job = {"job_id": "fljob-aaaa", "spec": spec, "profile": "fast", "env_keys": {"fast": "fast-0"},
           "spec_hash": "h", "uv": str(uv)}
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        tar.add(TRAINER_DIR / "trainer.py", "trainer.py")
    job["sync_streams"] = [{"dest": ".", "size": len(buf.getvalue())}]
    r = subprocess.run([sys.executable, str(agent), "--home", str(home), "submit"],
                       input=json.dumps(job).encode() + b"\n" + buf.getvalue(), capture_output=True,
                       timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    state = home / "jobs" / "fljob-aaaa" / "state.json"
    for _ in range(600):
        st = json.loads(state.read_text())
        if st["state"] in ("succeeded", "failed"):
            break
        time.sleep(0.1)
    log = (home / "jobs" / "fljob-aaaa" / "job.log").read_text()
    assert st["state"] == "succeeded", log[-2000:]
    assert f"--find-links {(tmp_path / 'flat').as_uri()}" in log
    marker = json.loads((home / "envs" / "fast-0" / envs.OK_MARKER).read_text())
    assert marker["installer"] == "uv" and marker["packages"] == {"gpujob-demo-kernels": "1.0.0+fast"}
