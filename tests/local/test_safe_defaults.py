"""Safe defaults (issue 12, item 3) on the `local` target, with the real CLI and the
real supervisor: a rollback by hand judges nothing unless --mark-bad; the ledger set
by hand; submit onto a bad profile refused unless --force; stop/rollback without an
id only when exactly one job could be meant; cache clear needs -p or --all; Ctrl-C on
``logs -f`` exits 130; --json on submit, stop and rollback."""

from __future__ import annotations

import json
import signal
import subprocess
from pathlib import Path

import yaml

from helpers import cli, cli_json, gpujob_argv, job_id_of, local_env, wait_for, write_spec


def status(job_id: str, env: dict) -> dict:
    return cli_json(["status", job_id, "--json"], env)


def ledger_file(tmp_path: Path, root: str = "root") -> dict:
    return json.loads((tmp_path / root / "ledger" / "tjob.json").read_text())


def one_error_line(p: subprocess.CompletedProcess) -> str:
    text = p.stderr.decode()
    assert "Traceback" not in text and len(text.strip().splitlines()) == 1, text
    return text.strip()


def long_spec(tmp_path: Path, index_urls: dict, profile: str = "slow") -> Path:
    return write_spec(tmp_path / "job.yaml", target="box", fast_url=index_urls["fast"],
                      slow_url=index_urls["slow"], profile=profile, throughput=False, warmup=False,
                      trainer_args="--steps 100000 --interval 0.05")


def test_mark_bad_ledger_by_hand_and_submit_onto_a_bad_profile(tmp_path, index_urls):
    env = local_env(tmp_path)
    spec = long_spec(tmp_path, index_urls)
    job_id = job_id_of(cli(["submit", str(spec)], env, check=True).stdout)
    wait_for(lambda: status(job_id, env)["state"] == "training", 60, what="training")
    # no id: the one running job is meant; --mark-bad records the profile left bad
    res = cli_json(["rollback", "--to", "fast", "--mark-bad", "--json"], env)
    assert res["requested"] and res["from"] == "slow" and res["to"] == "fast" and res["mark_bad"]
    wait_for(lambda: status(job_id, env)["profile"] == "fast" and status(job_id, env)["state"] == "training",
             60, what="rollback by request")
    slow = ledger_file(tmp_path)["profiles"]["slow"]
    assert slow["status"] == "bad" and slow["reason"] == "rolled back by hand"
    stopped = cli_json(["stop", "--json"], env)
    assert stopped["job_id"] == job_id and stopped["state"] == "stopped"

    # submit onto the bad profile: one line naming it, its reason and the ways on; nothing started
    jobs_before = sorted(p.name for p in (tmp_path / "root" / "jobs").iterdir())
    p = cli(["submit", str(spec)], env)
    assert p.returncode == 5 and p.stdout == b""
    line = one_error_line(p)
    assert "profile slow is marked bad" in line and "rolled back by hand" in line
    assert "--force" in line and "gpujob ledger set box tjob slow untried" in line
    assert sorted(p.name for p in (tmp_path / "root" / "jobs").iterdir()) == jobs_before
    assert [r["job"] for r in cli_json(["ps", "--json"], env)] == [job_id]  # none recorded here either

    # by hand: untried removes the entry; bad with a reason, shown literally when refused
    p = cli(["ledger", "set", "box", "tjob", "slow", "untried"], env, check=True)
    assert "slow bad -> untried" in p.stdout.decode()
    assert "slow" not in ledger_file(tmp_path)["profiles"]
    cli(["ledger", "set", "box", "tjob", "fast", "bad", "--reason", "odd [bold]x[/bold]"], env, check=True)
    assert ledger_file(tmp_path)["profiles"]["fast"]["status"] == "bad"
    p = cli(["submit", str(spec), "-p", "fast"], env)
    assert p.returncode == 5 and "odd [bold]x[/bold]" in one_error_line(p)
    # good by hand makes it the last known-good
    res = cli_json(["ledger", "set", "box", "tjob", "fast", "good", "--json"], env)
    assert res["before"] == "bad" and res["ledger"]["last_good"] == "fast"
    cli(["ledger", "set", "box", "tjob", "fast", "bad"], env, check=True)
    assert "last_good" not in ledger_file(tmp_path)

    # --force starts on it anyway; --json is one object with the job id and target
    p = cli(["submit", str(spec), "-p", "fast", "--force", "--json"], env, check=True)
    res = json.loads(p.stdout)
    assert res["target"] == "lab/box" and res["supervisor_pid"] > 0
    assert status(res["job_id"], env)["profile"] == "fast"
    cli(["stop", res["job_id"]], env, check=True)

    # bad input: one line, exit 2, the ledger untouched
    before = ledger_file(tmp_path)
    for args in (["ledger", "set", "box", "tjob", "fast", "maybe"],
                 ["ledger", "set", "box", "Not A Name", "fast", "good"],
                 ["ledger", "set", "box", "tjob", "--", "-x", "good"]):
        p = cli(args, env)
        assert p.returncode == 2, (args, p.stderr.decode())
        one_error_line(p)
    assert ledger_file(tmp_path) == before


def test_stop_and_rollback_without_an_id_need_exactly_one_job_and_ctrl_c_is_130(tmp_path, index_urls):
    env = local_env(tmp_path)
    hosts = tmp_path / "two.yaml"
    hosts.write_text(yaml.safe_dump({"hosts": {"lab": {"kind": "local", "containers": {
        "box": {"root": str(tmp_path / "root")}, "box2": {"root": str(tmp_path / "root2")}}}}}))
    env["GPUJOB_HOSTS"] = str(hosts)
    spec = long_spec(tmp_path, index_urls, profile="fast")
    one = job_id_of(cli(["submit", str(spec)], env, check=True).stdout)
    two = job_id_of(cli(["submit", str(spec), "--target", "box2"], env, check=True).stdout)
    for j in (one, two):
        wait_for(lambda: status(j, env)["state"] == "training", 60, what="training")
    for verb in (["stop"], ["rollback", "--to", "slow"]):
        p = cli(verb, env)
        assert p.returncode == 2
        line = one_error_line(p)
        assert line == (f"gpujob: more than one job could be meant: {two} (lab/box2, training), "
                        f"{one} (lab/box, training); name one")
    assert status(one, env)["state"] == status(two, env)["state"] == "training"
    assert status(one, env)["profile"] == "fast" and not status(one, env)["rollbacks"]
    assert cli_json(["status", "--json"], env)["job"] == two  # status keeps "the most recent"

    # Ctrl-C on a real `logs -f`: detached, exit 130, the job runs on
    proc = subprocess.Popen([*gpujob_argv(), "logs", "-f", one], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    wait_for(lambda: proc.stdout.readline().startswith(b"step "), 30, what="a step line")
    proc.send_signal(signal.SIGINT)
    _, errb = proc.communicate(timeout=120)  # a hang guard: slow on a loaded 2-core machine
    assert proc.returncode == 130, errb.decode()
    assert f"detached from {one}" in errb.decode()
    assert status(one, env)["state"] == "training"

    # one stopped by id: the other is the only one that could be meant
    cli(["stop", one], env, check=True)
    p = cli(["stop"], env, check=True)
    assert p.stdout.decode().startswith(f"{two}: stopped")
    p = cli(["rollback"], env)
    assert p.returncode == 2 and "no job could be meant" in one_error_line(p)
    # the index said training, the container says stopped: as fetched, nothing is meant
    p = cli(["stop"], env)
    assert p.returncode == 2 and "no job could be meant" in one_error_line(p)


def test_cache_clear_needs_a_profile_or_all(tmp_path):
    env = local_env(tmp_path)
    for args in (["cache", "clear", "box"], ["cache", "clear", "box", "-p", "fast", "--all"]):
        p = cli(args, env)
        assert p.returncode == 2 and p.stdout == b""
        assert "--all" in one_error_line(p)
    assert not (tmp_path / "root").exists()  # nothing reached the container
    p = cli(["cache", "clear", "box", "--all"], env, check=True)
    assert "cleared: nothing" in p.stdout.decode()
