"""Issue 34, a user's first day: the path between the features (init -> plan -> submit ->
the jobs index), through the installed entry point on the local kind."""

from __future__ import annotations

import json
import os
from pathlib import Path

import yaml

from gpujob.spec.model import load_spec
from helpers import cli, local_env

NANO = '''import os, time
from model import GPT
exec(open('configurator.py').read())
print("iter 0: loss 1.0, time 10.00ms")
'''


def nanogpt_repo(where: Path) -> Path:
    """A nanoGPT-shaped checkout: train.py importing model.py and exec'ing configurator.py,
    a config file given as an argument, and a data folder the command does not name."""
    where.mkdir(parents=True, exist_ok=True)
    (where / "train.py").write_text(NANO)
    (where / "model.py").write_text("class GPT: pass\n")
    (where / "configurator.py").write_text("pass\n")
    (where / "config").mkdir()
    (where / "config" / "train_tiny.py").write_text("max_iters = 5\n")
    (where / "data").mkdir()
    (where / "data" / "big.bin").write_bytes(b"x" * 10)
    return where


def run_in(cwd: Path, args: list, env: dict):
    return cli(args, dict(env, GPUJOB_TEST_CWD=str(cwd)))


def test_init_ships_the_script_its_config_and_what_it_imports_then_plan_and_submit_run_it(tmp_path):
    """Row 1: the spec init writes ships train.py, the config named as an argument, model.py
    and configurator.py (imported / opened beside it), not the data folder; the job runs."""
    repo = nanogpt_repo(tmp_path / "nanoGPT")
    env = local_env(tmp_path)
    p = run_in(repo, ["init", "--recipe", "nanogpt", "-t", "lab/box", "--", "python", "train.py",
                      "config/train_tiny.py", "--max_iters=5"], env)
    assert p.returncode == 0, p.stderr.decode()
    spec = load_spec(repo / "train.yaml")
    assert [(s.src, s.dest) for s in spec.sync] == [("train.py", "train.py"), ("config/train_tiny.py",
                                                    "config/train_tiny.py"), ("model.py", "model.py"),
                                                   ("configurator.py", "configurator.py")]
    plan = run_in(repo, ["submit", "train.yaml", "--plan"], env)
    assert plan.returncode == 0, plan.stderr.decode()
    assert ("no code to ship" not in plan.stdout.decode()
            and "which no sync entry ships" not in plan.stdout.decode())


def test_init_in_another_folder_writes_src_relative_to_the_spec(tmp_path):
    repo = nanogpt_repo(tmp_path / "nanoGPT")
    (tmp_path / "specs").mkdir()
    env = local_env(tmp_path)
    p = run_in(repo, ["init", "--recipe", "nanogpt", "-o", "../specs/t.yaml", "--", "python", "train.py"],
               env)
    assert p.returncode == 0, p.stderr.decode()
    spec = load_spec(tmp_path / "specs" / "t.yaml")
    assert ("../nanoGPT/train.py", "train.py") in [(s.src, s.dest) for s in spec.sync]


def test_plan_warns_when_the_command_names_a_file_that_is_not_shipped(tmp_path):
    """Row 1: the issue's spec (no sync:) says so in the plan instead of failing in the container."""
    repo = nanogpt_repo(tmp_path / "nanoGPT")
    (repo / "train.yaml").write_text(yaml.safe_dump({
        "name": "train", "target": "lab/box", "profiles": [{"name": "base", "system_site_packages": True}],
        "train": {"command": "python train.py config/train_tiny.py --out_dir=out"}}))
    plan = run_in(repo, ["submit", "train.yaml", "--plan"], local_env(tmp_path))
    assert plan.returncode == 0, plan.stderr.decode()
    text = plan.stdout.decode()
    assert "names train.py, which no sync entry ships" in text
    assert "names config/train_tiny.py, which no sync entry ships" in text
    assert "out" not in [w.split(",")[0] for w in text.split() if "which no sync" in w]


def test_dest_dot_and_dest_slash_mean_into_that_directory(tmp_path):
    """Row 2: `dest: .` and `dest: code/` for a file, as cp and rsync read them."""
    repo = nanogpt_repo(tmp_path / "r")
    (repo / "j.yaml").write_text(yaml.safe_dump({
        "name": "j", "target": "lab/box", "profiles": [{"name": "base", "system_site_packages": True}],
        "sync": [{"src": "train.py", "dest": "."}, {"src": "model.py", "dest": "code/"},
                 {"src": "config", "dest": "."}],
        "train": {"command": "python train.py"}}))
    spec = load_spec(repo / "j.yaml")
    assert [s.dest for s in spec.sync] == ["train.py", "code/model.py", "."]
    env = local_env(tmp_path)
    p = run_in(repo, ["submit", "j.yaml"], env)
    assert p.returncode == 0, p.stderr.decode()
    run_in(repo, ["logs", "-f"], env)  # the job ends (train.py fails on its own import): nothing left running
    work = tmp_path / "root" / "work" / "j"
    found = sorted(str(f.relative_to(work)) for f in work.rglob("*") if f.is_file())
    assert {"train.py", "code/model.py", "train_tiny.py"} <= set(found), found


def test_a_failed_submit_leaves_no_job_row_in_ps_nor_in_the_container(tmp_path):
    """Row 2: the agent's submit fails (a file shipped onto a folder that is there): exit 4 with
    its reason, and no phantom `not_found` job in ps, in the index Tab completes from, or remotely."""
    repo = nanogpt_repo(tmp_path / "r")
    (repo / "j.yaml").write_text(yaml.safe_dump({
        "name": "j", "target": "lab/box", "profiles": [{"name": "base", "system_site_packages": True}],
        "sync": [{"src": "train.py", "dest": "code"}], "train": {"command": "python code"}}))
    (tmp_path / "root" / "work" / "j" / "code").mkdir(parents=True)
    env = local_env(tmp_path)
    for _ in range(2):
        p = run_in(repo, ["submit", "j.yaml"], env)
        assert p.returncode == 4 and "IsADirectoryError" in p.stderr.decode(), p.stderr.decode()
    ps = run_in(repo, ["ps", "--json"], env)
    assert ps.returncode == 0 and json.loads(ps.stdout) == [], ps.stdout.decode()
    assert not [d for d in os.listdir(tmp_path / "root" / "jobs")], "a job folder stayed in the container"
    import sqlite3
    db = sqlite3.connect(tmp_path / "state" / "gpujob" / "state.db")
    assert db.execute("SELECT count(*) FROM jobs").fetchone()[0] == 0


def test_the_daemons_console_on_a_closed_pipe_is_a_quiet_end_not_rich_exiting_the_daemon(monkeypatch,
                                                                                         tmp_path):
    """Row 9 (`gpujob status | head -2` through the kept connection): rich's own answer to a
    broken pipe dup2'd devnull over the daemon's stdout and raised SystemExit in its worker,
    so the client said `the connection daemon ended while the command ran` (exit 3)."""
    from gpujob.daemon.console import ReaderGone, client_console
    spare = open(tmp_path / "stdout", "w")  # what rich would dup2 over: never the suite's own fd 1
    monkeypatch.setattr("sys.stdout", spare)
    r, w = os.pipe()
    os.close(r)
    c = client_console(w, "utf-8", {}, [0, w, 2])
    try:
        c.print("x" * 70000)
        raise AssertionError("a print to a closed pipe went through")
    except ReaderGone:
        pass
    finally:
        os.close(w)
        spare.close()


def test_exec_to_a_closed_pipe_without_the_daemon_is_exit_0_and_ends_the_command(tmp_path):
    """Row 9: `gpujob exec T -- seq 1 100000 | head -1` (the full CLI; the local kind)."""
    import subprocess
    from helpers import gpujob_argv, user_env
    env = user_env(local_env(tmp_path), daemon=False)
    p = subprocess.Popen([*gpujob_argv(), "exec", "lab/box", "--", "sh", "-c", "seq 1 100000; sleep 60"],
                         env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
    assert p.stdout.readline() == b"1\n"
    p.stdout.close()
    err = p.stderr.read().decode()
    assert p.wait(timeout=60) == 0 and err == "", err


README_HOSTS = ("hosts:\n  pve1:\n    address: 10.1.2.6\n    user: root\n    containers:\n      ct200: "
                "{vmid: 200, gpus: 8}\n")


def fresh_home(tmp_path: Path) -> dict:
    """An empty HOME as a new user has it: no GPUJOB_HOSTS, no XDG dirs of the suite's."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUJOB_", "XDG_"))}
    home = tmp_path / "home"
    home.mkdir()
    env.update(HOME=str(home), COLUMNS="200")
    for k in ("XDG_RUNTIME_DIR", "GPUJOB_CONN_IDLE"):  # the suite's own daemons' place (tests/conftest.py)
        if k in os.environ:
            env[k] = os.environ[k]
    return env


def test_the_demo_host_lives_beside_the_users_hosts_yaml_and_a_clones_never_shadows_it(tmp_path):
    """Rows 3 and 4: after README step 2 (~/.config/gpujob/hosts.yaml), `demo` still reaches
    the built-in local/demo (a job there, and `status JOB` of it, work); a folder's example
    ./hosts.yaml is not read in place of the user's, and the plan says which file was."""
    env = fresh_home(tmp_path)
    config = Path(env["HOME"]) / ".config" / "gpujob" / "hosts.yaml"
    config.parent.mkdir(parents=True)
    config.write_text(README_HOSTS)
    clone = tmp_path / "clone"
    repo = nanogpt_repo(clone)
    (clone / "hosts.yaml").write_text(README_HOSTS.replace("10.1.2.6", "10.9.9.9"))
    (repo / "j.yaml").write_text(yaml.safe_dump({
        "name": "j", "target": "ct200", "profiles": [{"name": "base", "system_site_packages": True}],
        "sync": [{"src": "model.py"}], "train": {"command": "python model.py"}}))
    plan = run_in(clone, ["submit", "j.yaml", "--plan"], env)
    text = plan.stdout.decode()
    assert plan.returncode == 0, plan.stderr.decode()
    assert f"pve1/ct200: from {config}" in text and \
        f"hosts.yaml is not read ({config} comes first" in text, text
    assert "10.1.2.6" in text and "10.9.9.9" not in text
    sub = run_in(clone, ["submit", "j.yaml", "-t", "demo"], env)
    assert sub.returncode == 0, sub.stderr.decode()
    job = [w for w in sub.stdout.decode().split() if w.startswith("j-")][0]
    assert run_in(clone, ["logs", "-f", job], env).returncode == 0
    st = run_in(clone, ["status", job], env)
    assert st.returncode == 0 and "succeeded" in st.stdout.decode(), (st.stdout + st.stderr).decode()
    assert run_in(clone, ["exec", "local/demo", "--", "true"], env).returncode == 0


def slow_trace(tmp_path: Path, baseline) -> Path:
    """A job's trace as the supervisor writes it: its throughput section on the first line,
    one run of a slow profile from its start, judged against the known-good's baseline."""
    from gpujob.agent.base import trace
    tp = {"format": "ktok", "min_ratio": 0.8, "window": "10s", "failure_limit": "30s", "good_after": 20}
    w = trace.TraceWriter(str(tmp_path), {"name": "t", "job": "t-0000", "recorded_by": "test",
                                          "meta": {"throughput": tp}})
    run = {"profile": "slow", "phase": "train", "resume": True}
    if baseline is not None:
        run["baseline"] = baseline
    w.write({"t": 1000.0, "run": run})
    for i in range(900):
        w.write({"t": round(1005 + i / 10, 3), "out": f"step {i} 300K tok/s"})
    w.close()
    return tmp_path / trace.NAME


def test_replay_judges_against_the_recorded_baseline_and_reads_the_traces_own_throughput(tmp_path):
    """Row 10: a min_ratio job that rolled back replays as a rollback (not `would not have
    rolled back`), from the trace file alone (no --spec), and --baseline takes 811K."""
    env = local_env(tmp_path)
    recorded = slow_trace(tmp_path / "a", 811000.0) if (tmp_path / "a").mkdir() is None else None
    p = cli(["replay", str(recorded), "--json"], env)
    assert p.returncode == 0, p.stderr.decode()
    assert json.loads(p.stdout.splitlines()[-1])["summary"]["rollbacks"] == 1
    (tmp_path / "b").mkdir()
    bare = slow_trace(tmp_path / "b", None)  # a trace from before runs recorded their baseline
    p = cli(["replay", str(bare), "--json"], env)
    assert p.returncode == 0 and json.loads(p.stdout.splitlines()[-1])["summary"]["rollbacks"] == 0
    p = cli(["replay", str(bare), "--baseline", "811K", "--json"], env)
    assert p.returncode == 0, p.stderr.decode()
    assert json.loads(p.stdout.splitlines()[-1])["summary"]["rollbacks"] == 1
    bad = cli(["replay", str(bare), "--baseline", "fast"], env)
    assert bad.returncode == 2 and bad.stderr.decode().startswith("gpujob: --baseline: expected a number")


def test_cancel_is_answered_with_stop_not_the_nearest_spelling(tmp_path):
    """Row 12: `gpujob cancel` (SkyPilot's and Slurm's word) said `did you mean cache`."""
    p = cli(["cancel", "j-0000"], local_env(tmp_path))
    assert p.returncode == 2 and p.stderr.decode() == \
        "gpujob: no command 'cancel'; gpujob's word for it is 'stop' (try 'gpujob stop --help')\n"
    assert "Did you mean 'cache'" in cli(["cach"], local_env(tmp_path)).stderr.decode()


def two_profile_spec(repo: Path, command: str) -> str:
    (repo / "j.yaml").write_text(yaml.safe_dump({
        "name": "j", "target": "lab/box", "profiles": [{"name": "base", "system_site_packages": True},
                                                      {"name": "other", "system_site_packages": True}],
        "train": {"command": command}}))
    return "j.yaml"


def test_logs_follow_exits_with_the_jobs_outcome_and_a_busy_container_names_stop(tmp_path):
    """Row 12: `logs -f` of a failed job exited 0; the busy refusal did not name `gpujob stop JOB`;
    `rollback --to` on a finished job restarted it without saying it had ended."""
    repo = tmp_path / "r"
    repo.mkdir()
    env = local_env(tmp_path)
    spec = two_profile_spec(repo, "python3 -c 'raise SystemExit(3)'")
    job = run_in(repo, ["submit", spec], env).stdout.decode().split()[1]
    f = run_in(repo, ["logs", "-f", job], env)
    assert f.returncode == 1 and f.stderr.decode().startswith(f"gpujob: job {job} failed"), f.stderr.decode()
    spec = two_profile_spec(repo, "python3 -c 'import time; time.sleep(120)'")
    long = run_in(repo, ["submit", spec], env).stdout.decode().split()[1]
    try:
        busy = run_in(repo, ["submit", spec], env)
        assert busy.returncode == 5 and f"`gpujob stop {long}` ends it" in busy.stderr.decode(), \
            busy.stderr.decode()
    finally:
        assert run_in(repo, ["stop", long], env).returncode == 0
    spec = two_profile_spec(repo, "true")
    done = run_in(repo, ["submit", spec, "-f"], env)
    assert done.returncode == 0, done.stderr.decode()
    ok = done.stdout.decode().split()[1]
    rb = run_in(repo, ["rollback", ok, "--to", "other"], env)
    assert rb.returncode == 0 and f"{ok}: had ended (succeeded): it runs again, restarted on other" in \
        rb.stdout.decode(), (rb.stdout + rb.stderr).decode()
    assert run_in(repo, ["logs", "-f", ok], env).returncode == 0


def test_status_says_a_rate_is_not_current_a_suspect_and_judging_that_waits_for_a_baseline():
    """Rows 8 and 12: during warmup the last run's tok/s is labelled as such; an unconfirmed
    suspect is shown; with min_ratio and no baseline yet, status says there is no judging."""
    from rich.console import Console
    from gpujob.show import render

    def shown(st: dict) -> str:
        c = Console(record=True, width=200)
        render.print_status(c, render.status_view(dict({"job_id": "j-1", "profile": "slow", "tps": 4300.0,
                                                        "tps_recent": [4300.0]}, **st), "lab/box"))
        return c.export_text()
    warm = shown({"state": "warmup", "phase": "warmup"})
    assert "last tok/s  4.3K tok/s   (the last train run's; now warmup" in warm
    suspect = {"profile": "slow", "target": "fast", "signal": "throughput", "status_before": "untried"}
    text = shown({"state": "training", "phase": "train", "suspect": suspect, "baseline": 12800.0,
                  "window": {"threshold": 10240.0, "median": 12000.0, "threshold_source": "min_ratio"}})
    assert "suspect  slow (was untried) left on throughput: not marked bad until fast holds" in text
    assert "last tok/s" not in text
    text = shown({"state": "training", "phase": "train"})
    assert "judging  none yet: min_ratio needs a baseline" in text


HF_OWN_FLAGS = '''import argparse
from transformers import Trainer, TrainingArguments
p = argparse.ArgumentParser()
p.add_argument("--model", default="gpt2")
p.add_argument("--per_device_train_batch_size", type=int)
p.add_argument("--max_seq_length", type=int)
a = p.parse_args()
'''


def test_init_plans_open_without_a_warning_and_hf_trainer_invents_no_flags_the_script_lacks(tmp_path):
    """Rows 7, 8: every spec init writes passes --plan with no warning (it opened with one about
    initial_delay vs checkpoint.every); on a script with its own argparse, the hf_trainer recipe's
    warmup (--max_steps ...) and resume (--resume_from_checkpoint) flags are turned off with a
    CHANGE ME instead of being added to a command that would refuse them."""
    env = local_env(tmp_path)
    (tmp_path / "train_hf.py").write_text(HF_OWN_FLAGS)
    args = ["python", "train_hf.py", "--per_device_train_batch_size", "2", "--max_seq_length", "64"]
    for recipe in ("nanogpt", "hf_trainer", "specforge", "lightning", "torchtitan"):
        p = run_in(tmp_path, ["init", "-r", recipe, "-t", "lab/box", "-o", f"{recipe}.yaml", "--", *args],
                   env)
        assert p.returncode == 0, p.stderr.decode()
        plan = run_in(tmp_path, ["submit", f"{recipe}.yaml", "--plan", "--json"], env)
        assert plan.returncode == 0, plan.stderr.decode()
        steps = json.loads(plan.stdout)["steps"]
        assert [s["what"] for s in steps if s["kind"] == "warning"] == [], recipe
    hf = load_spec(tmp_path / "hf_trainer.yaml")
    assert hf.warmup is None and hf.train.checkpoint is None and not hf.train.resume_args
    assert "--max_steps" not in (tmp_path / "hf_trainer.yaml").read_text().split("# What the recipe")[1]
    assert load_spec(tmp_path / "nanogpt.yaml").train.checkpoint is None  # --init_from=resume: not its flag
    repo = nanogpt_repo(tmp_path / "nanoGPT")  # nanoGPT's configurator takes any --key=value of its globals
    p = run_in(repo, ["init", "-r", "nanogpt", "-t", "lab/box", "--", "python", "train.py"], env)
    assert p.returncode == 0, p.stderr.decode()
    nano = load_spec(repo / "train.yaml")
    assert nano.rollback.wait_for_checkpoint and nano.train.checkpoint is not None and nano.warmup is not None
    plan = run_in(repo, ["submit", "train.yaml", "--plan", "--json"], env)
    assert [s for s in json.loads(plan.stdout)["steps"] if s["kind"] == "warning"] == []


def test_doctor_spec_takes_set_and_nanogpt_is_a_repository_not_a_package(tmp_path):
    """Row 7: `doctor --spec` took no --set, and warned `nanoGPT is not installed in the venv`."""
    repo = nanogpt_repo(tmp_path / "nanoGPT")
    env = local_env(tmp_path)
    assert run_in(repo, ["init", "-r", "nanogpt", "-t", "lab/nowhere", "--", "python", "train.py"],
                  env).returncode == 0
    p = run_in(repo, ["doctor", "--spec", "train.yaml", "--set", "target=lab/box", "--json"], env)
    report = json.loads(p.stdout)
    assert list(report) == ["lab/box"], (p.stdout + p.stderr).decode()
    recipe = [c for c in report["lab/box"] if c["name"].startswith("recipe")]
    assert [c["status"] for c in recipe] == ["ok"] and "not a package" in recipe[0]["detail"], recipe
    bad = run_in(repo, ["doctor", "lab/box", "--set", "name=x"], env)
    assert bad.returncode == 2 and "--set: only with --spec" in bad.stderr.decode()


def test_a_wait_over_2s_says_what_it_waits_for_with_bytes_and_rate_in_a_pipe(monkeypatch):
    """Item 2 / row 11: a 300 MB sync said one line, then 8 s of nothing. In a pipe: a plain line
    with the bytes shipped, of how many, and the rate; then what comes next (the supervisor)."""
    import io
    from rich.console import Console
    from gpujob.show import waits
    monkeypatch.setattr(waits, "AFTER", 0.0)
    monkeypatch.setattr(waits, "EVERY", 0.05)
    now = [100.0]
    buf = io.StringIO()
    w = waits.Wait(Console(file=buf, force_terminal=False, width=200), "probing lab/box",
                   clock=lambda: now[0])
    w.bytes(120_000_000, 300_000_000)
    now[0] += 3.0
    assert w.text() == "probing lab/box: 120.0 MB of 300.0 MB, 40.0 MB/s"
    w.say("waiting for the supervisor to start (300.0 MB shipped)")
    now[0] += 4.0
    assert w.text() == "waiting for the supervisor to start (300.0 MB shipped) (4s)"
    with w:
        import time
        deadline = time.monotonic() + 30
        while not w.lines and time.monotonic() < deadline:
            time.sleep(0.01)
    assert "· waiting for the supervisor to start (300.0 MB shipped) (4s)" in buf.getvalue()
    quiet = io.StringIO()
    monkeypatch.setattr(waits, "AFTER", 30.0)
    with waits.Wait(Console(file=quiet, force_terminal=False), "quick"):
        pass
    assert quiet.getvalue() == ""  # a wait that ends before 2 s says nothing
