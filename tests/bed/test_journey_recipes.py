"""Issue 34 item 4 for the recipes whose trainer stands in on the CPU (hf_trainer, specforge,
torchtitan, lightning, nanogpt), on the loopback Proxmox bed, one journey driver for all: from an
empty HOME, a hosts.yaml written by hand; the user's folder with their script (a launcher
beside tests/data/recipes/standin.py, which prints that trainer's progress lines and keeps
its checkpoints with its layout and cadence) and its own flags; `gpujob init --recipe R -t
ct200 -- COMMAND`; only the edits its CHANGE ME marks ask for (the profiles: a fast and a
slow wheel from the index on loopback; tokens_per_step where it asks); --plan; submit; logs
-f; status; an automatic rollback; stop of a long run while it saves, and a new job resumed
from what the stopped one kept (`submit --resume-from`). It asserts what the person reads."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import pytest

from helpers import wait_for
from journey import QUICK, User, job_of, tokens_per_step, two_builds

pytestmark = pytest.mark.testbed

DATA = Path(__file__).parents[1] / "data"

#: recipe -> (its launcher, the files of the user's folder beside it, the command with the
#: trainer's own flags, the steps flag again for a long run)
CASES = {
    "hf_trainer": ("train_hf.py", {}, "python train_hf.py --output_dir out --per_device_train_batch_size 4 "
                   "--max_seq_length 640 --max_steps 100", "--max_steps 100000"),
    "specforge": ("specforge_train.py", {"run.yaml": "model: tiny\n"},
                  "python specforge_train.py train -c run.yaml output_dir=out run_id=tiny "
                  "training.max_steps=100 "
                  "training.save_interval=10 training.log_interval=2", "training.max_steps=100000"),
    "torchtitan": ("titan_train.py", {"train.toml": "[training]\nsteps = 100\n"},
                   "python titan_train.py --job.config_file train.toml --training.steps 100",
                   "--training.steps 100000"),
    "lightning": ("main.py", {"config.yaml": "trainer: {}\n"},
                  "python main.py fit --config config.yaml --trainer.callbacks+=ModelCheckpoint "
                  "--trainer.callbacks.every_n_train_steps=10 --trainer.max_steps=100",
                  "--trainer.max_steps=100000"),
    # its eval and ckpt.pt save every 30 iterations (6 s fast: longer than the recipe's 5 s settle)
    "nanogpt": ("train_nano.py", {}, "python train_nano.py --batch_size=1 --block_size=2560 "
                "--gradient_accumulation_steps=1 --eval_interval=30 --max_iters=100", "--max_iters=100000"),
}


#: the line of each trainer's progress at step 30 of the long run (in `gpujob logs`)
PROGRESS = {"hf_trainer": r" 30/100000 ", "specforge": r"step 30: ", "torchtitan": r"step: 30 ",
            "lightning": r" 30/100000 ", "nanogpt": r"iter 30: "}


@pytest.mark.parametrize("recipe", sorted(CASES))
def test_a_first_day_with_the_recipe(recipe, testbed, tmp_path, index):
    me = User(tmp_path)
    home = f"/root/gj-journey-{recipe}-{os.getpid()}"
    try:
        _journey(me, recipe, testbed, index, home)
    finally:
        testbed.container_exec("sh", "-c", f"pkill -f '{home}/' ; rm -rf {home}")


def _journey(me: User, recipe: str, testbed, index, home: str) -> None:
    config = me.hosts_by_hand(testbed, home)
    launcher, files, command, long_steps = CASES[recipe]
    repo = me.home / "project"
    repo.mkdir()
    shutil.copy(DATA / "journeys" / launcher, repo / launcher)
    shutil.copy(DATA / "recipes" / "standin.py", repo / "standin.py")
    for name, text in files.items():
        (repo / name).write_text(text)
    me.cwd = repo

    init = me.ok("init", "--recipe", recipe, "-t", "ct200", "--", *command.split())
    said = re.match(r"wrote (\S+)\.yaml: check the CHANGE ME lines, then `gpujob submit \1\.yaml --plan`$",
                    init.err)
    assert said, init.err
    name = said.group(1)  # after the script, as the spec's `name:`
    spec = repo / f"{name}.yaml"
    text = spec.read_text()
    assert f"\nname: {name}\n" in text, text
    for shipped in (launcher, "standin.py", *files):  # the script, what it imports, what the command names
        assert f'{{src: "{shipped}", dest: "{shipped}"}}' in text, text
    spec.write_text(tokens_per_step(two_builds(text, index), 2560))

    plan = me.ok("submit", spec.name, "--plan", *QUICK)
    assert "warning" not in plan.out and "no code to ship" not in plan.out, plan.out
    assert f"pve1/ct200: from {config}" in plan.out and f"{home}/work/{name}/{launcher}" in plan.out, plan.out

    # act 1: the fast build trains and becomes known-good
    job1 = job_of(me.ok("submit", spec.name, "-p", "fast", *QUICK).out, name)
    follow = me.ok("logs", "-f", job1)
    assert "done at step 100" in follow.out, follow.out[-3000:]
    st = me.ok("status", job1)
    assert "succeeded" in st.out and "fast" in st.out and "good" in st.out, st.out

    # act 2: the slow build, rolled back automatically against act 1's baseline, resumed from its checkpoint
    job2 = job_of(me.ok("submit", spec.name, "-p", "slow", *QUICK).out, name)
    assert job2 in me.ok("status", job2).out
    follow = me.ok("logs", "-f", job2)
    # its trainer never found act 1's checkpoints by itself (HF's example scripts resume from the
    # newest of --output_dir, torchtitan from its folder's: each job has its own)
    assert "resumed from checkpoint at step 100\n" not in follow.out, follow.out[-2000:]
    assert "ROLLBACK slow -> fast" in follow.out, follow.out[-3000:]
    assert "resumed from checkpoint at step" in follow.out, follow.out[-3000:]
    st = me.ok("status", job2)
    assert "succeeded" in st.out and "slow → fast" in st.out, st.out

    # a long run, stopped while it saves: stop says how it ended; logs -f then exits 1 saying so
    long = f"{command} {long_steps}"  # (its flag given again: the last one wins, as in argparse)
    job3 = job_of(me.ok("submit", spec.name, "-p", "fast", *QUICK, "--set", f"train.command={long}").out,
                  name)
    wait_for(lambda: re.search(PROGRESS[recipe], me.ok("logs", job3).out), 180, every=1.0,
             what=f"step 30 of {job3} (it saves all the while)")
    stop = me.ok("stop", job3)
    assert f"{job3}: stopped" in stop.out and "unfinished" not in stop.out, stop.out
    end = me.run("logs", "-f", job3)
    assert end.returncode == 1 and f"gpujob: job {job3} stopped" in end.err, end.err
    # what it saved is kept: a new job resumes from the stopped one's last finished checkpoint
    # (torchtitan: through --checkpoint.initial_load_path, as the new job's own folder is not there yet)
    sub = me.ok("submit", spec.name, "-p", "fast", *QUICK, "--resume-from", job3)
    follow = me.ok("logs", "-f", job_of(sub.out, name))
    assert "resumed from checkpoint at step" in follow.out, follow.out[-1500:]
    if recipe == "nanogpt":  # --init_from=resume loads its own out_dir's ckpt.pt: the stopped job's, copied
        assert re.search(rf"copied from \S+/out/{job3}/ckpt\.pt to this job's out/{name}-\S+/ckpt\.pt",
                         follow.out), follow.out[-1500:]
