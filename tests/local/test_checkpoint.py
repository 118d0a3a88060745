"""Checkpoint awareness: the plan's warning, the resume point recorded after a
rollback, and rollback.wait_for_checkpoint holding a rollback until one exists."""

from __future__ import annotations

import json
import time


from gpujob.agent.home import ckregister
from gpujob.agent.judge import checkpoint
from gpujob.agent.base import ckpaths
from helpers import cli, cli_json, events, job_id_of, local_env, wait_for, write_spec


def test_step_names_resume_point_and_description(tmp_path):
    assert ckpaths.step_of("out/ckpt_step_400.pt") == 400
    assert ckpaths.step_of("iter-12/model.safetensors".split("/")[0]) == 12
    assert ckpaths.step_of("ckpt-000400.pt") == 400
    assert ckpaths.step_of("latest.pt") is None
    assert checkpoint.describe(ckregister.point(None, time.time())) == "no checkpoint: restarted from scratch"
    t = time.time()
    reg = {"files": {"ck/step_1.pt": {"finished": True, "changed": t - 100, "step": 1, "run": 1},
                     "ck/step_2.pt": {"finished": True, "changed": t - 12, "step": 2, "run": 2},
                     "ck/step_3.pt": {"finished": False, "changed": t - 1, "step": 3, "run": 2}}}
    point = ckregister.point(ckregister.newest(reg, exists=lambda p: True), t)
    assert point["file"] == "ck/step_2.pt" and point["step"] == 2
    assert checkpoint.describe(point) == "resumed from ck/step_2.pt (age 12s, step 2)"
    assert ckregister.newest(reg, run=1, exists=lambda p: True)["path"] == "ck/step_1.pt"
    assert ckregister.newest(reg, exists=lambda p: p != "ck/step_2.pt")["path"] == "ck/step_1.pt"


SPEC = {"train": {"checkpoint": {"path": "c/*.pt", "every": 30.0}},
        "throughput": {"initial_delay": 10.0}, "rollback": {"on": ["low_throughput", "gpu_idle"],
                                                            "gpu_idle": {"for": 20.0}}}


def test_warnings_when_the_policy_can_decide_before_the_first_checkpoint():
    w = checkpoint.warnings(SPEC)
    assert len(w) == 2 and w[0].startswith("throughput.initial_delay (10s, counted from the first sample) "
                                           "with the time parts of window and failure_limit (12.5s in all) "
                                           "is shorter than train.checkpoint.every (30s)")
    # issue 38: a deep drop is decided once a quarter of the (default 10 s) window holds it, whatever
    # the failure_limit: 10 + 2.5 s < 30 s; a 2m window's quarter is 30 s: 10 + 30 >= 30, no warning
    assert len(checkpoint.warnings(dict(SPEC, throughput={"initial_delay": 10.0, "window": "10s",
                                                          "failure_limit": "2m"}))) == 2
    assert len(checkpoint.warnings(dict(SPEC, throughput={"initial_delay": 10.0, "window": "2m",
                                                          "failure_limit": 3}))) == 1
    assert "rollback.gpu_idle.for (20s)" in w[1]
    assert checkpoint.warnings(dict(SPEC, rollback={"on": ["low_throughput"],
                                                    "wait_for_checkpoint": True})) == []
    assert checkpoint.warnings(dict(SPEC, throughput={"initial_delay": 40.0},
                                    rollback={"on": ["low_throughput"]})) == []
    assert checkpoint.warnings({"train": {}}) == []


def ck_spec(tmp_path, index_urls, *, ck_every: int, wait: bool, path: str = "checkpoint.json",
            every: str = "1s", throughput: dict | None = None, steps: int = 40, trainer: str = "",
            interval: float = 0.05, ck: dict | None = None, resume_args: list | None = None):
    """The stand-in trainer's spec with train.checkpoint (settle 0.3 s: it saves often)."""
    spec = write_spec(tmp_path / "job.yaml", target="box", fast_url=index_urls["fast"],
                      slow_url=index_urls["slow"], warmup=False, throughput=throughput,
                      trainer_args=f"--steps {steps} --interval {interval} --checkpoint-every {ck_every} "
                                   f"{trainer}",
                      rollback={"wait_for_checkpoint": wait} if wait else None)
    import yaml
    data = yaml.safe_load(spec.read_text())
    data["train"]["checkpoint"] = dict({"path": path, "every": every, "settle": "0.3s"}, **(ck or {}))
    if resume_args is not None:
        data["train"]["resume_args"] = resume_args
    spec.write_text(yaml.safe_dump(data))
    return spec


def rollback_job(tmp_path, index_urls, *, keep_first: bool = False, **kw):
    env = local_env(tmp_path)
    spec = ck_spec(tmp_path, index_urls, **kw)
    plan = cli(["submit", str(spec), "--plan"], env, check=True).stdout.decode()
    assert cli(["submit", str(spec), "--profile", "fast", "--follow"], env, timeout=120).returncode == 0
    for f in (tmp_path / "root" / "work").rglob("checkpoint.json"):
        if not keep_first:
            f.unlink()  # act 2 starts from nothing
    p = cli(["submit", str(spec), "--follow"], env, timeout=120)
    assert p.returncode == 0, p.stdout.decode()[-3000:]
    job_id = job_id_of(p.stdout)
    return plan, cli_json(["status", job_id, "--json"], env), events(tmp_path / "root" / "jobs" / job_id), \
        (tmp_path / "root" / "jobs" / job_id / "train.log").read_text(), p.stdout.decode()


def test_wait_for_checkpoint_holds_the_rollback_and_resumes_from_it(tmp_path, index_urls):
    # slow is caught after ~3-4 steps; its first checkpoint comes at step 12
    plan, st, ev, log, out = rollback_job(tmp_path, index_urls, ck_every=12, wait=True)
    assert "warning" not in plan  # wait_for_checkpoint: no warning
    kinds = [e["type"] for e in ev]
    assert kinds.index("rollback_held") < kinds.index("rollback_released") < kinds.index("rollback")
    released = next(e for e in ev if e["type"] == "rollback_released")
    assert released["why"] == "a checkpoint exists" and released["waited"] > 0.1
    # while held, each sample's verdict is still rollback: journalled once (the H200's nanoGPT
    # run wrote 51 such lines in 12 s)
    held = [e for e in ev if e["type"] == "decision" and e["verdict"] == "rollback"
            and e["t"] <= released["t"]]
    assert len(held) == 1, len(held)
    [rb] = st["rollbacks"]
    assert rb["resumed"].startswith("resumed from ") and "checkpoint.json (age" in rb["resumed"]
    assert "resumed from checkpoint at step 12" in log
    assert "resumed from" in out  # status table / banner


def test_without_a_checkpoint_the_rollback_says_restarted_from_scratch(tmp_path, index_urls):
    tp = {"format": "ktok", "window": 3, "min": "10K", "failure_limit": 2, "no_data_timeout": "30s",
          "good_after": "1s", "initial_delay": "1.5s", "resume_initial_delay": 0}
    plan, st, ev, log, out = rollback_job(tmp_path, index_urls, ck_every=1000, wait=False, every="3s",
                                          throughput=tp, steps=80)
    assert "warning" in plan and \
        "initial_delay (1.5s, counted from the first sample)" in plan.replace("\n", " ") and \
        "shorter than train.checkpoint.every (3s)" in plan.replace("\n", " ")
    # decision -> trainer start -> first sample -> first good -> first ok, in that order
    t = st["rollbacks"][0]["timings"]
    assert sorted(t) == sorted(["trainer_start", "first_sample", "first_good", "first_ok"])
    assert t["trainer_start"] <= t["first_sample"] <= t["first_good"] <= t["first_ok"]
    # resume_initial_delay 0 for the known-good profile resumed: ok long before initial_delay (1.5 s)
    assert t["first_ok"] - t["trainer_start"] < 1.4
    assert [e["mark"] for e in ev if e["type"] == "rollback_timing"] == ["first_sample", "first_good",
                                                                         "first_ok"]
    assert "decision →" in out and "ok " in out
    [rb] = st["rollbacks"]
    assert rb["resumed"] == "no checkpoint of this job: restarted from scratch, without resume_args"
    assert not trains(ev)[1]["argv"][-1].endswith("--resume")
    assert not any(e["type"] == "rollback_held" for e in ev)
    assert any(e["type"] == "resume_point" and e["file"] is None for e in ev)


def trains(ev):
    return [e for e in ev if e["type"] == "phase" and e["phase"] == "train"]


# ---- checkpoints of this job only (issue 22, item 4) ----------------------------------

def test_a_checkpoint_file_an_earlier_job_left_is_never_resumed_from(tmp_path, index_urls):
    """nanoGPT keeps one out/ckpt.pt: the first job leaves it at step 40; the second job's
    slow run is caught before it saves, and its rollback must not take the old file."""
    tp = {"format": "ktok", "window": 3, "min": "10K", "failure_limit": 2, "no_data_timeout": "30s",
          "good_after": "1s"}
    plan, st, ev, log, out = rollback_job(tmp_path, index_urls, ck_every=80, wait=False, every="3s",
                                          keep_first=True, throughput=tp, steps=80)
    assert "resumed from checkpoint" not in log  # today: "resumed from checkpoint at step 80"
    assert not trains(ev)[1]["argv"][-1].endswith("--resume")
    [rb] = st["rollbacks"]
    assert rb["resumed"] == "no checkpoint of this job: restarted from scratch, without resume_args"
    left = next(e for e in ev if e["type"] == "checkpoints_left")
    assert left["count"] == 1 and left["files"][0].endswith("checkpoint.json")
    assert "left by earlier jobs" in out


def test_wait_for_checkpoint_waits_for_this_runs_own_checkpoint(tmp_path, index_urls):
    """The earlier job's checkpoint.json (step 40) does not release the hold; the slow
    run's own first save (step 12) does, and the resumed trainer starts from it."""
    plan, st, ev, log, out = rollback_job(tmp_path, index_urls, ck_every=12, wait=True, keep_first=True,
                                          resume_args=["--resume-from", "{resume_from}"], steps=60)
    kinds = [e["type"] for e in ev]
    assert kinds.index("rollback_held") < kinds.index("rollback_released") < kinds.index("rollback")
    released = next(e for e in ev if e["type"] == "rollback_released")
    assert released["why"] == "a checkpoint exists" and released["file"].endswith("checkpoint.json")
    assert released["age"] >= 0 and released["waited"] > 0.3
    resumed = log.split("resumed from checkpoint at step ")[1].split()[0]
    assert resumed in ("12", "24") and resumed != "60"
    argv = trains(ev)[1]["argv"]
    assert argv[-1].endswith("checkpoint.json") and "--resume-from" in argv[-1]  # {resume_from} filled


def test_a_directory_checkpoint_still_being_written_is_not_finished_and_a_stop_waits(tmp_path, index_urls):
    """HF-style checkpoint-N/ directories whose trainer_state.json lands 4 s after the
    first file: a stop asked in between waits for the save before it signals the trainer."""
    env = local_env(tmp_path)
    spec = ck_spec(tmp_path, index_urls, ck_every=10, wait=False, path="ck/checkpoint-*", steps=400,
                   trainer="--checkpoint-dir ck --save-seconds 4", interval=0.05, ck={"settle": "6s"},
                   throughput=False)
    job_id = job_id_of(cli(["submit", str(spec), "--profile", "fast"], env, check=True).stdout)
    ck = tmp_path / "root" / "work" / "tjob" / "ck" / "checkpoint-10"
    wait_for(lambda: (ck / "model.json").exists(), 60, 0.02, "the first save to begin")
    assert not (ck / "trainer_state.json").exists()

    def registered():  # the register's poll (every 0.5 s; later under load) has seen the directory
        regs = list((tmp_path / "root" / "checkpoints").glob("*.json"))
        return regs and json.loads(regs[0].read_text())["files"]

    wait_for(registered, 3, 0.05, "the register to see the save being written")
    assert not (ck / "trainer_state.json").exists()  # still within the save
    reg = json.loads(next((tmp_path / "root" / "checkpoints").glob("*.json")).read_text())
    [entry] = reg["files"].values()
    assert entry["finished"] is False  # the directory exists, but the save is not done
    cli(["stop", job_id], env, check=True)
    wait_for(lambda: cli_json(["status", job_id, "--json"], env)["state"] == "stopped", 60, 0.2, "stopped")
    assert (ck / "trainer_state.json").exists()  # today: killed mid-save, no trainer_state.json
    ev = events(tmp_path / "root" / "jobs" / job_id)
    waited = next(e for e in ev if e["type"] == "save_waited")
    assert waited["finished"] and waited["waited"] > 0.3
    reg = json.loads(next((tmp_path / "root" / "checkpoints").glob("*.json")).read_text())
    assert reg["files"][str(ck)]["finished"] is True


def test_a_rollback_held_for_a_checkpoint_is_in_status_with_how_long_it_may_still_wait(tmp_path, index_urls):
    """Issue 38 row 6: a decided rollback that waits for a checkpoint shows in status (what it
    waits for, how long so far, at most how long still) and in job.log (logs -f)."""
    env = local_env(tmp_path)
    spec = ck_spec(tmp_path, index_urls, ck_every=100000, wait=True, every="20s")
    assert cli(["submit", str(spec), "--profile", "fast", "--follow"], env, timeout=120).returncode == 0
    spec = ck_spec(tmp_path, index_urls, ck_every=100000, wait=True, every="20s", steps=100000)
    job_id = job_id_of(cli(["submit", str(spec)], env, check=True).stdout)
    jdir = tmp_path / "root" / "jobs" / job_id
    wait_for(lambda: any(e["type"] == "rollback_held" for e in events(jdir)), 120, what="the held rollback")
    st = cli_json(["status", job_id, "--json"], env)
    assert st["waiting"].startswith("rollback decided, waiting for a finished checkpoint of this run "
                                    "(checkpoint.json): ") and "left at most" in st["waiting"], st["waiting"]
    human = cli(["status", job_id], env, check=True).stdout.decode()
    assert "rollback decided, waiting for a finished checkpoint" in " ".join(human.split())
    assert "held until this run writes a finished checkpoint (checkpoint.json), 100s at most" in \
        (jdir / "job.log").read_text()
    assert cli(["stop", job_id], env, timeout=120).returncode == 0
    assert cli_json(["status", job_id, "--json"], env)["waiting"] is None
