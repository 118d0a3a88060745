"""Which checkpoints are this job's (issue 35 row 1, issue 33 items 3 and 7): a glob whose
directory becomes a link during the run is judged where it leads; a file that was there
before the run is never registered; gc deletes only what the register wrote down and
still matches; a file renamed into place is a finished save; a look at a huge tree is
paced by what it costs."""

from __future__ import annotations

import os
import shutil
import time

import pytest

from gpujob.agent.home import ckregister, ckscan
from gpujob.agent.home.journal import Home
from gpujob.agent.verbs import prune


def begin(tmp_path, pattern: str, settle: float = 0.3):
    home = str(tmp_path / "home")
    w = ckregister.CkWatch.begin(home, "j-1", "j", "fast", str(tmp_path / pattern), str(tmp_path), True,
                                 settle, None, time.time())
    return home, w


def others_data(top) -> list:
    """A data directory another job and a user filled before this run."""
    (top / "checkpoint-700").mkdir(parents=True)
    (top / "checkpoint-700" / "model.bin").write_bytes(b"theirs")
    (top / "precious.txt").write_text("a user's")
    old = time.time() - 3600
    for p in (top / "checkpoint-700" / "model.bin", top / "checkpoint-700", top / "precious.txt"):
        os.utime(p, (old, old))
    time.sleep(ckscan.PRE_RUN_SLACK + 0.3)  # their ctime (set by utime) before the run too
    return sorted(str(p) for p in top.iterdir())


def write_ours(w, link, names):
    for n in names:
        (link / n).mkdir()
        (link / n / "model.bin").write_bytes(b"ours")
    t = time.time()
    w.poll(t + 1, force=True)
    w.poll(t + 2, force=True)  # quiet for longer than settle: finished
    w.close(t + 3, clean=True)


def gc_paths(home) -> list:
    return sorted(p for g in prune.checkpoint_groups(Home(home)) for p, _ in g["files"])


def test_a_link_made_during_the_run_to_a_data_dir_never_makes_others_files_this_jobs(tmp_path):
    data = tmp_path / "data" / "run"
    theirs = others_data(data)
    (tmp_path / "w").mkdir()
    home, w = begin(tmp_path, "w/ckpt/*")
    assert w.reg["runs"][0]["before"] == {}  # the link is not there yet: the glob matches nothing
    os.symlink(data, tmp_path / "w" / "ckpt")  # the command's `ln -sfn /data/run ckpt && python train.py`
    write_ours(w, tmp_path / "w" / "ckpt", ["checkpoint-2", "checkpoint-4"])
    reg = ckregister.load(home, "j-1")
    ours = [str(tmp_path / "w" / "ckpt" / n) for n in ("checkpoint-2", "checkpoint-4")]
    assert sorted(reg["files"]) == ours
    assert {e["real"] for e in reg["files"].values()} == {str(data)}
    assert gc_paths(home) == ours
    for path, _why in prune.select_checkpoints(prune.checkpoint_groups(Home(home)), 0):
        prune.remove_checkpoint(Home(home), path)
    assert sorted(str(p) for p in data.iterdir()) == theirs  # the data directory as it was
    assert (data / "checkpoint-700" / "model.bin").read_bytes() == b"theirs"


def test_a_link_to_a_system_directory_registers_nothing(tmp_path):
    sysdir = "/var/tmp/gpujob-ckowner-%d" % os.getpid()  # under /var: a system tree
    os.makedirs(sysdir)
    try:
        (tmp_path / "w").mkdir()
        home, w = begin(tmp_path, "w/ckpt/*")
        os.symlink(sysdir, tmp_path / "w" / "ckpt")
        write_ours(w, tmp_path / "w" / "ckpt", ["checkpoint-2"])
        assert ckregister.load(home, "j-1")["files"] == {}
        assert (w.refused_why and "leads to /var/tmp/gpujob-ckowner" in w.refused_why
                and "/var" in w.refused_why)
        assert gc_paths(home) == []
    finally:
        shutil.rmtree(sysdir)


def test_plain_layout_registers_the_runs_saves_and_gc_deletes_only_what_still_matches(tmp_path):
    (tmp_path / "w" / "ckpt").mkdir(parents=True)
    home, w = begin(tmp_path, "w/ckpt/*")
    write_ours(w, tmp_path / "w" / "ckpt", ["checkpoint-2", "checkpoint-4"])
    ours = [str(tmp_path / "w" / "ckpt" / n) for n in ("checkpoint-2", "checkpoint-4")]
    assert sorted(ckregister.load(home, "j-1")["files"]) == ours and gc_paths(home) == ours
    # someone replaces checkpoint-4 by another directory of the same name: no longer ours
    shutil.rmtree(ours[1])
    os.mkdir(ours[1])
    (tmp_path / "w" / "ckpt" / "checkpoint-4" / "x").write_text("someone else's")
    assert gc_paths(home) == ours[:1]
    # the directory is made a link elsewhere after the run: gc follows no link out of it
    elsewhere = tmp_path / "elsewhere"
    shutil.move(str(tmp_path / "w" / "ckpt"), str(elsewhere))
    os.symlink(elsewhere, tmp_path / "w" / "ckpt")
    assert gc_paths(home) == []


def test_a_file_there_before_the_run_is_never_registered_even_when_it_appears_later(tmp_path):
    (tmp_path / "w").mkdir()
    (tmp_path / "stash").mkdir()
    old = tmp_path / "stash" / "ck-1"
    old.write_text("an earlier job's")
    time.sleep(ckscan.PRE_RUN_SLACK + 0.3)
    home = str(tmp_path / "home")
    os.symlink(tmp_path / "stash", tmp_path / "w" / "more")
    w2 = ckregister.CkWatch.begin(home, "j-2", "j", "fast", str(tmp_path / "w/more/ck-*"), str(tmp_path),
                                  True, 0.3, None, time.time())
    assert w2.reg["runs"][0]["before"] == {str(tmp_path / "w/more/ck-1"): ckscan.signature(str(old))}
    os.unlink(tmp_path / "w" / "more")
    os.mkdir(tmp_path / "w" / "more")  # it goes, and comes back through another directory later
    os.rename(tmp_path / "w" / "more", tmp_path / "w" / "gone")
    os.symlink(tmp_path / "stash", tmp_path / "w" / "more")
    t = time.time()
    w2.poll(t + 1, force=True)
    assert w2.reg["files"] == {}  # unchanged since the start: never this job's
    assert ckscan.pre_existing(str(old), ckscan.signature(str(old)), time.time())
    with open(old, "a") as f:
        f.write(" rewritten by this run")
    w2.poll(t + 2, force=True)
    assert list(w2.reg["files"]) == [str(tmp_path / "w/more/ck-1")]  # changed during the run: now it is


def test_a_checkpoint_renamed_into_place_is_finished_when_seen_and_never_torn(tmp_path):
    (tmp_path / "w").mkdir()
    home, w = begin(tmp_path, "w/ckpt.pt", settle=30.0)  # a settle no save here would reach
    target = tmp_path / "w" / "ckpt.pt"

    def save(text):
        tmp = tmp_path / "w" / "ckpt.pt.tmp"
        tmp.write_text(text)
        os.replace(tmp, target)

    t = time.time()
    save("step 2")
    w.poll(t + 1, force=True)
    save("step 4")  # rewritten every few seconds: each save is whole when it is there
    w.poll(t + 2, force=True)
    w.poll(t + 2.2, force=True)  # one look that sees it unchanged: no settle of 30 s
    assert [e["path"] for e in w.just_finished] == [str(target)]
    assert w.saving() == [] and w.newest_own(t + 2)["file"] == str(target)
    assert w.close(t + 3, clean=False) == []  # the trainer is killed: the file at the path is whole
    assert ckregister.newest(ckregister.load(home, "j-1"))["path"] == str(target)
    # written in place (same inode): a save in progress until it settles, torn when killed
    with open(target, "w") as f:
        f.write("step 6, half")
    w2 = ckregister.CkWatch.begin(home, "j-1", "j", "fast", str(target), str(tmp_path), True, 30.0, None,
                                  time.time())
    with open(target, "a") as f:
        f.write(" and more")
    w2.poll(time.time() + 1, force=True)
    assert [e["path"] for e in w2.saving()] == [str(target)]
    assert [e["path"] for e in w2.close(time.time() + 2, clean=False)] == [str(target)]


@pytest.mark.parametrize("n", [20000])
def test_a_huge_tree_is_looked_at_less_often_and_a_walk_counts_each_entry_once(tmp_path, n):
    d = tmp_path / "w" / "tree"
    d.mkdir(parents=True)
    for i in range(n):
        (d / f"f{i}").write_bytes(b"")
    sig = ckscan.signature(str(d))
    assert sig[:3] == ["d", n, 0]
    home, w = begin(tmp_path, "w/tree/*")
    t = time.time()
    w.poll(t + 1, force=True)
    assert w.min_gap > 0  # the next look is paced by what this one cost
    assert w.poll(t + 1 + min(w.min_gap, ckregister.MAX_GAP) / 2) == []  # too soon: no look at all
    assert w.min_gap <= ckregister.MAX_GAP


def test_a_trainer_renaming_its_checkpoint_every_2s_is_rolled_back_from_its_last_save_and_stopped(
        tmp_path, index_urls):
    # issue 33 row 2: nanoGPT-like, one file rewritten by rename every ~2 s, settle longer than that
    from helpers import cli, cli_json, events, job_id_of, local_env, wait_for, write_spec
    import yaml
    env = local_env(tmp_path)
    spec = write_spec(tmp_path / "job.yaml", target="box", fast_url=index_urls["fast"],
                      slow_url=index_urls["slow"], warmup=False, throughput=False, profile="fast",
                      trainer_args="--steps 100000 --interval 0.1 --checkpoint-every 20")
    data = yaml.safe_load(spec.read_text())
    data["train"]["checkpoint"] = {"path": "checkpoint.json", "every": "2s", "settle": "5s"}
    spec.write_text(yaml.safe_dump(data))
    job_id = job_id_of(cli(["submit", str(spec)], env, check=True).stdout)
    jdir = tmp_path / "root" / "jobs" / job_id
    wait_for(lambda: sum(e["type"] == "checkpoint_finished" for e in events(jdir)) >= 2, 120,
             what="two finished saves")
    p = cli(["rollback", job_id, "--to", "slow"], env, check=True)
    assert p.returncode == 0
    wait_for(lambda: any(e["type"] == "resume_point" for e in events(jdir)), 120, what="the resume")
    point = next(e for e in events(jdir) if e["type"] == "resume_point")
    assert point["file"] and point["file"].endswith("checkpoint.json"), point
    wait_for(lambda: "resumed from checkpoint at step" in (jdir / "train.log").read_text(), 120,
             what="the trainer's resume")
    step = int((jdir / "train.log").read_text().split("resumed from checkpoint at step ")[1].split()[0])
    assert step >= 20 and step % 20 == 0
    p = cli(["stop", job_id], env, timeout=120)
    assert p.returncode == 0, p.stderr.decode()
    ev = events(jdir)
    assert not [e for e in ev if e["type"] == "save_waited" and not e["finished"]]
    assert not [e for e in ev if e["type"] == "checkpoint_torn"]
    assert cli_json(["status", job_id, "--json"], env)["state"] == "stopped"


def test_a_job_whose_checkpoint_glob_covers_100k_files_finishes_and_status_answers(tmp_path, index_urls):
    """Issue 33 item 7 / 35 row 3: a glob over a tree of 100k files left by others; the job
    saves its own checkpoint there. It finishes, status answers meanwhile, the register holds
    only the job's own file and keeps a bounded copy of what was there (bench/cktree.py has
    the figure: the job's duration against a tree of 10 files)."""
    from helpers import cli, cli_json, events, job_id_of, local_env, wait_for, write_spec
    import yaml
    env = local_env(tmp_path)
    tree = tmp_path / "root" / "work" / "tjob" / "tree"
    tree.mkdir(parents=True)
    for i in range(100_000):
        os.close(os.open(tree / f"f{i:06d}.bin", os.O_CREAT | os.O_WRONLY, 0o644))
    time.sleep(ckscan.PRE_RUN_SLACK + 0.3)
    spec = write_spec(tmp_path / "job.yaml", target="box", fast_url=index_urls["fast"],
                      slow_url=index_urls["slow"], warmup=False, throughput=False, profile="fast",
                      trainer_args="--steps 60 --interval 0.05 --checkpoint tree/ckpt.json "
                                   "--checkpoint-every 20")
    data = yaml.safe_load(spec.read_text())
    data["train"]["checkpoint"] = {"path": "tree/*", "every": "1s", "settle": "0.3s"}
    spec.write_text(yaml.safe_dump(data))
    job_id = job_id_of(cli(["submit", str(spec)], env, check=True).stdout)
    answered = 0
    for _ in range(3):
        st = cli_json(["status", job_id, "--json"], env)
        answered += st["job"] == job_id
    assert answered == 3
    wait_for(lambda: cli_json(["status", job_id, "--json"], env)["state"] == "succeeded", 300,
             what="the job to finish")
    reg = ckregister.load(str(tmp_path / "root"), job_id)
    assert (list(reg["files"]) == [str(tree / "ckpt.json")]
            and reg["files"][str(tree / "ckpt.json")]["finished"])
    assert (reg["runs"][0]["before_count"] == 100_000
            and len(reg["runs"][0]["before"]) == ckregister.BEFORE_KEPT)
    left = [e for e in events(tmp_path / "root" / "jobs" / job_id) if e["type"] == "checkpoints_left"]
    assert left and left[0]["count"] == 100_000


def test_gpujob_stop_says_it_waited_for_a_save_in_progress(tmp_path, index_urls):
    """Issue 33 item 3: a stop that finds a save in progress lets it finish, and `gpujob stop`
    says how long it waited for it (job.log and status say it while it waits)."""
    from helpers import cli, job_id_of, local_env, wait_for, write_spec
    import yaml
    env = local_env(tmp_path)
    spec = write_spec(tmp_path / "job.yaml", target="box", fast_url=index_urls["fast"],
                      slow_url=index_urls["slow"], warmup=False, throughput=False, profile="fast",
                      trainer_args="--steps 100000 --interval 0.05 --checkpoint-dir ckpt --checkpoint-every "
                                   "10 --save-seconds 3")
    data = yaml.safe_load(spec.read_text())
    data["train"]["checkpoint"] = {"path": "ckpt/checkpoint-*", "every": "1s",
                                   "done_file": "trainer_state.json"}
    spec.write_text(yaml.safe_dump(data))
    job_id = job_id_of(cli(["submit", str(spec)], env, check=True).stdout)
    ck = tmp_path / "root" / "work" / "tjob" / "ckpt"
    wait_for(lambda: ck.exists() and any(not (d / "trainer_state.json").exists() for d in ck.iterdir()), 120,
             what="a save in progress")
    p = cli(["stop", job_id], env, timeout=120)
    assert p.returncode == 0, p.stderr.decode()
    out = p.stdout.decode()
    assert "s for a checkpoint save before signalling the trainer" in out and f"{job_id}: stopped" in out, out
    log = (tmp_path / "root" / "jobs" / job_id / "job.log").read_text()
    assert "a checkpoint is being saved (ckpt/checkpoint-" in log and "checkpoint save finished after" in log
