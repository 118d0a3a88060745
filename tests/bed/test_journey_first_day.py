"""Issue 34 item 4: a user's first day as a test, on the loopback Proxmox bed, in the order
the issue's user went: from an empty HOME, through the installed entry point with the kept
connection on (the default). README command 1 (the demo); a hosts.yaml written by hand after
it (README step 2); `gpujob init` on a nanoGPT-shaped script with its own flags (config file,
model.py, configurator.py); --plan; submit; logs -f; status; an automatic rollback (a fast
and a slow wheel from a package index on loopback); rollback --to; stop; replay; plot -o.
It asserts what the user reads (exit codes, lines), not internals."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import pytest

from journey import User, job_of

pytestmark = pytest.mark.testbed

TRAINER = Path(__file__).parents[1] / "data" / "firstday"


def test_a_first_day(testbed, tmp_path, index):
    me = User(tmp_path)
    home = f"/root/gj-first-day-{os.getpid()}"
    try:
        _first_day(me, testbed, index, home)
    finally:
        testbed.container_exec("sh", "-c", f"pkill -f '{home}/' ; rm -rf {home}")


def _first_day(me: User, testbed, index, home: str) -> None:
    # README command 1: the offline demo, a rollback live
    demo = me.ok("demo", timeout=600)
    assert "ROLLBACK slow -> fast" in demo.out and "What happened" in demo.out
    demo_job = job_of(demo.out, "demo")

    # README step 2, by hand: the user's own hosts.yaml (this bed's sshd and keys)
    config = me.hosts_by_hand(testbed, home)
    # the demo lives on beside it (row 3): status of its job, and the demo itself, still reach it
    st = me.ok("status", demo_job)
    assert demo_job in st.out and "succeeded" in st.out
    again = me.ok("demo", timeout=600)
    assert "ROLLBACK slow -> fast" in again.out
    assert me.ok("exec", "ct200", "--", "true").returncode == 0

    # their own nanoGPT-shaped checkout; `gpujob init` on it (row 1, 7, 8)
    repo = me.home / "nanoGPT"
    shutil.copytree(TRAINER, repo)
    me.cwd = repo
    init = me.ok("init", "--recipe", "nanogpt", "-t", "ct200", "--", "python", "train.py",
                 "config/train_tiny.py", "--batch_size=4", "--block_size=640",
                 "--gradient_accumulation_steps=1")
    assert "wrote train.yaml: check the CHANGE ME lines" in init.err
    text = (repo / "train.yaml").read_text()
    for shipped in ("train.py", "config/train_tiny.py", "model.py", "configurator.py"):
        assert f'{{src: "{shipped}", dest: "{shipped}"}}' in text
    # the CHANGE ME edits: two wheel builds of the kernels, from the index on loopback
    text = text.replace("""  - name: base                # the container's own interpreter and packages
    system_site_packages: true
""", f"""  - name: fast
    index_url: {index["fast"]}
    packages: ["gpujob-demo-kernels==1.0.0+fast"]
  - name: slow
    index_url: {index["slow"]}
    packages: ["gpujob-demo-kernels==1.0.0+slow"]
""")
    (repo / "train.yaml").write_text(text)
    quick = ["--set", "throughput.good_after=4s", "--set", "throughput.window=3", "--set",
             "throughput.failure_limit=2", "--set", "train.checkpoint.every=20s"]

    plan = me.ok("submit", "train.yaml", "--plan", *quick)
    assert "warning" not in plan.out and "no code to ship" not in plan.out
    assert f"pve1/ct200: from {config}" in plan.out
    assert f"{home}/work/train/train.py" in plan.out

    # act 1: the fast build trains and becomes known-good
    first = me.ok("submit", "train.yaml", "-p", "fast", *quick)
    job1 = job_of(first.out, "train")
    follow = me.ok("logs", "-f", job1)
    assert "iter 60: loss" in follow.out
    st = me.ok("status", job1)
    assert "succeeded" in st.out and "fast" in st.out and "good" in st.out

    # act 2: the slow build, rolled back automatically against act 1's baseline
    second = me.ok("submit", "train.yaml", "-p", "slow", *quick)
    job2 = job_of(second.out, "train")
    assert me.ok("status", job2).returncode == 0
    follow = me.ok("logs", "-f", job2)
    assert "ROLLBACK slow -> fast" in follow.out, follow.out[-3000:]
    assert f"resuming training from out/{job2} at iter" in follow.out  # its own out_dir (recipe rev 4)
    st = me.ok("status", job2)
    assert "succeeded" in st.out and "slow → fast" in st.out

    # replay judges it as it was judged live; plot -o draws it
    replay = me.ok("replay", job2)
    assert re.search(r"segment\(s\): [1-9]\d* rollback\(s\)", replay.out), replay.out
    svg = repo / "act2.svg"
    me.ok("plot", job2, "-o", str(svg), timeout=600)
    assert svg.read_text().lstrip().startswith(("<?xml", "<svg"))

    # rollback --to of the ended job says it runs again (from its last checkpoint: iter 60, the end)
    again = me.ok("rollback", job2, "--to", "slow")
    assert f"{job2}: had ended (succeeded): it runs again, restarted on slow" in again.out
    assert me.ok("logs", "-f", job2).returncode == 0

    # a long run, stopped: logs -f then says how it ended, with exit 1
    long = me.ok("submit", "train.yaml", "-p", "fast", *quick, "--set", "train.command=python train.py "
                 "config/train_tiny.py --batch_size=4 --block_size=640 --gradient_accumulation_steps=1 "
                 "--max_iters=100000")
    job3 = job_of(long.out, "train")
    stop = me.ok("stop", job3)
    assert job3 in stop.out
    end = me.run("logs", "-f", job3)
    assert end.returncode == 1 and f"gpujob: job {job3} stopped" in end.err, end.err
