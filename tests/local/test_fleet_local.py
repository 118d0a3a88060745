"""One job over two nodes on the `local` kind: two gpujob homes on this machine
(two containers of one local host, each its own root), the real CLI, real
supervisors leading and following over the signed channel, real venvs, and a
stdlib trainer that performs a real TCP rendezvous at {rdzv_endpoint}."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from helpers import REPO, cli, cli_json, events, wait_for

TRAINER = REPO / "tests" / "data" / "fleet"


@pytest.fixture
def env(tmp_path):
    hosts = tmp_path / "hosts.yaml"
    hosts.write_text(yaml.safe_dump({"hosts": {"lab": {"kind": "local", "containers": {
        "n0": {"root": str(tmp_path / "n0")}, "n1": {"root": str(tmp_path / "n1")}}}}}))
    e = dict(os.environ)
    e.update(GPUJOB_HOSTS=str(hosts), XDG_STATE_HOME=str(tmp_path / "state"), COLUMNS="200")
    return e


def fleet_spec(path: Path, urls: dict, profile: str = "fast", steps: int = 40, interval: float = 0.1,
               **extra) -> Path:
    spec = {
        "name": "fleet",
        "target": ["lab/n0", "lab/n1"],
        "sync": [{"src": str(TRAINER), "dest": ".", "exclude": ["__pycache__", "checkpoint.json"]}],
        "profiles": [
            {"name": "fast", "index_url": urls["fast"], "packages": ["gpujob-demo-kernels==1.0.0+fast"]},
            {"name": "slow", "index_url": urls["slow"], "packages": ["gpujob-demo-kernels==1.0.0+slow"]},
        ],
        "profile": profile,
        "nodes": {"lost_after": "6s", "env": [{"CUDA_VISIBLE_DEVICES": "0"}, {"CUDA_VISIBLE_DEVICES": "1"}]},
        "train": {"command": f"python trainer.py --nnodes {{nnodes}} --node-rank {{node_rank}} "
                             f"--rdzv-endpoint {{rdzv_endpoint}} --steps {steps} --interval {interval}",
                  "resume_args": ["--resume"], "grace": "3s"},
        "throughput": {"format": "ktok", "window": 3, "min": "20K", "failure_limit": 2,
                       "no_data_timeout": "30s", "good_after": "1s", "aggregate": "sum"},
        "rollback": {"fallback": ["fast"], "on": ["low_throughput", "stall"]},
    }
    spec.update(extra)
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def node_dir(tmp_path: Path, rank: int, job_id: str) -> Path:
    return tmp_path / f"n{rank}" / "jobs" / job_id


def node_state(tmp_path: Path, rank: int, job_id: str) -> dict:
    return json.loads((node_dir(tmp_path, rank, job_id) / "state.json").read_text())


def submitted(p) -> str:
    assert p.returncode == 0, p.stderr.decode()[-3000:]
    line = [ln for ln in p.stdout.decode().splitlines() if ln.startswith("submitted ")][0]
    return line.split()[1]


def status(job_id: str, env: dict) -> dict:
    return cli_json(["status", job_id, "--json"], env)


def test_two_nodes_rendezvous_train_and_succeed_as_one_job(tmp_path, env, index_urls):
    spec = fleet_spec(tmp_path / "job.yaml", index_urls, steps=40, interval=0.05)
    plan = cli(["submit", str(spec), "--plan"], env)
    assert plan.returncode == 0, plan.stderr.decode()
    text = plan.stdout.decode()
    assert "node 0 of 2" in text and "node 1 of 2" in text
    assert "--nnodes 2 --node-rank 1 --rdzv-endpoint " in text
    assert "127.0.0.1:<a port free on node 0, chosen at submit>" in text
    assert "NODE_RANK=1 MASTER_ADDR=127.0.0.1" in text and "CUDA_VISIBLE_DEVICES=1" in text
    assert not (tmp_path / "n0").exists() and not (tmp_path / "n1").exists()
    p = cli(["submit", str(spec), "--follow"], env, timeout=180)
    out = p.stdout.decode()
    job_id = submitted(p)
    assert p.returncode == 0, out[-3000:]
    assert "[node 0] " in out and "[node 1] " in out
    assert "[node 0] rendezvous: node 1 joined" in out
    assert "I am node 1" in out and "CUDA_VISIBLE_DEVICES=1" in out
    st = status(job_id, env)
    assert [n["state"] for n in st["nodes"]] == ["succeeded", "succeeded"]
    assert [n["container"] for n in st["nodes"]] == ["n0", "n1"]
    # the key never lands in a log, an event or the job's record
    for rank in (0, 1):
        d = node_dir(tmp_path, rank, job_id)
        job = json.loads((d / "job.json").read_text())
        assert "fleet_key" not in json.dumps(job) and not (d / "secrets.json").exists()
    ps = cli_json(["ps", "--json"], env)
    assert [v["job"] for v in ps] == [job_id]  # one job, counted once
    # the fleet's ledger is its own: known-good on two nodes, not on one
    led = json.loads(next((tmp_path / "n0" / "ledger").glob("fleet@x2-*.json")).read_text())
    assert led["profiles"]["fast"]["status"] == "good"


def test_slow_profile_rolls_back_on_both_nodes_and_both_resume(tmp_path, env, index_urls):
    # rollback.confirm 0s: slow is marked bad at fast's first ok window on the fleet's aggregate
    spec = fleet_spec(tmp_path / "job.yaml", index_urls, profile="slow", steps=60, interval=0.1,
                      rollback={"fallback": ["fast"], "on": ["low_throughput", "stall"], "confirm": "0s"})
    job_id = submitted(cli(["submit", str(spec)], env, timeout=180))
    wait_for(lambda: status(job_id, env)["state"] in ("succeeded", "failed", "stopped"), 150, every=1,
             what="the job's end")
    st = status(job_id, env)
    assert [n["state"] for n in st["nodes"]] == ["succeeded", "succeeded"], st
    assert [n["profile"] for n in st["nodes"]] == ["fast", "fast"]
    lead = node_state(tmp_path, 0, job_id)
    assert [r["to"] for r in lead["rollbacks"]] == ["fast"] and lead["rollbacks"][0]["from"] == "slow"
    assert [r["to"] for r in node_state(tmp_path, 1, job_id)["rollbacks"]] == ["fast"]
    for rank in (0, 1):
        log = (node_dir(tmp_path, rank, job_id) / "train.log").read_text()
        assert "kernels build slow" in log and "kernels build fast" in log
        assert "resumed from checkpoint" in log
    ev0 = events(node_dir(tmp_path, 0, job_id))
    assert [e["round"] for e in ev0 if e["type"] == "fleet_barrier"] == [0, 1]
    # slow is bad in the fleet's ledger now: a new submit onto it is refused, nothing starts
    again = cli(["submit", str(spec)], env, timeout=60)
    assert again.returncode == 5
    assert "profile slow is marked bad in the ledger of fleet@x2-" in again.stderr.decode()
    assert len(list((tmp_path / "n1" / "jobs").iterdir())) == 1


def test_a_node_trainer_killed_ends_the_job_on_both_with_its_reason(tmp_path, env, index_urls):
    spec = fleet_spec(tmp_path / "job.yaml", index_urls, steps=2000, interval=0.1)
    job_id = submitted(cli(["submit", str(spec)], env, timeout=180))
    wait_for(lambda: node_state(tmp_path, 1, job_id).get("tps"), 90, what="node 1 training")
    pgid = node_state(tmp_path, 1, job_id)["child"]["pgid"]
    kids = subprocess.run(["pgrep", "-g", str(pgid)], capture_output=True, text=True).stdout.split()
    trainer = [int(k) for k in kids if int(k) != pgid]
    assert trainer
    for pid in trainer:
        os.kill(pid, signal.SIGKILL)
    wait_for(lambda: all(node_state(tmp_path, r, job_id)["state"] == "failed" for r in (0, 1)), 60,
             what="both nodes failed")
    for rank in (0, 1):
        reason = node_state(tmp_path, rank, job_id)["reason"]
        assert "node 1 (lab/n1)" in reason and "SIGKILL" in reason, reason


def test_a_follower_supervisor_killed_is_revived_and_rejoins(tmp_path, env, index_urls):
    spec = fleet_spec(tmp_path / "job.yaml", index_urls, steps=80, interval=0.1)
    job_id = submitted(cli(["submit", str(spec)], env, timeout=180))
    wait_for(lambda: node_state(tmp_path, 1, job_id).get("tps"), 90, what="node 1 training")
    st1 = node_state(tmp_path, 1, job_id)
    os.kill(st1["supervisor_pid"], signal.SIGKILL)
    wait_for(lambda: subprocess.run(["kill", "-0", str(st1["supervisor_pid"])],
                                    capture_output=True).returncode != 0, 10, what="the supervisor gone")
    cli(["status", job_id], env, check=True)  # the revive path: a new supervisor re-adopts the trainer
    wait_for(lambda: node_state(tmp_path, 1, job_id).get("supervisor_pid") != st1["supervisor_pid"], 10,
             what="a new supervisor")
    wait_for(lambda: status(job_id, env)["state"] in ("succeeded", "failed"), 120, every=1, what="the end")
    st = status(job_id, env)
    assert [n["state"] for n in st["nodes"]] == ["succeeded", "succeeded"], st
    ev1 = events(node_dir(tmp_path, 1, job_id))
    assert any(e["type"] == "readopted" for e in ev1)
    ev0 = events(node_dir(tmp_path, 0, job_id))
    assert len([e for e in ev0 if e["type"] == "fleet_joined" and e["rank"] == 1]) >= 2


def test_a_busy_second_node_means_nothing_starts_on_either(tmp_path, env, index_urls):
    single = tmp_path / "single.yaml"
    spec = yaml.safe_load(fleet_spec(tmp_path / "job.yaml", index_urls).read_text())
    one = dict(spec, name="other", target="lab/n1",
               train={"command": "sleep 600", "grace": "1s"})
    for key in ("nodes", "throughput", "rollback"):
        one.pop(key)
    single.write_text(yaml.safe_dump(one))
    other = submitted(cli(["submit", str(single)], env, timeout=120))
    wait_for(lambda: json.loads((tmp_path / "n1" / "jobs" / other / "state.json").read_text())["state"]
             == "training", 60, what="the other job training")
    p = cli(["submit", str(tmp_path / "job.yaml")], env, timeout=120)
    assert p.returncode == 5, p.stderr.decode()
    err = p.stderr.decode()
    assert "node 1 (lab/n1) could not start: container busy: job " + other in err
    assert "nothing started on any node" in err
    jobs0 = list((tmp_path / "n0" / "jobs").iterdir())
    assert len(jobs0) == 1
    st0 = json.loads((jobs0[0] / "state.json").read_text())
    wait_for(lambda: json.loads((jobs0[0] / "state.json").read_text())["state"] == "stopped", 20,
             what="node 0 released")
    assert not (tmp_path / "n0" / "envs").exists()  # no venv was built, nothing ran
    assert not (jobs0[0] / "train.log").exists()
    assert st0.get("step") == "env"
    cli(["stop", other], env, check=True)


def test_the_leader_supervisor_killed_followers_keep_training_and_rejoin_the_revived_leader(
        tmp_path, env, index_urls):
    spec = fleet_spec(tmp_path / "job.yaml", index_urls, steps=80, interval=0.1)
    job_id = submitted(cli(["submit", str(spec)], env, timeout=180))
    wait_for(lambda: node_state(tmp_path, 1, job_id).get("tps"), 90, what="node 1 training")
    st0 = node_state(tmp_path, 0, job_id)
    follower_trainer = node_state(tmp_path, 1, job_id)["child"]["pgid"]
    os.kill(st0["supervisor_pid"], signal.SIGKILL)
    wait_for(lambda: "leader node 0 (lab/n0) unreachable" in
             (node_dir(tmp_path, 1, job_id) / "job.log").read_text(), 20, what="the follower noticing")
    assert node_state(tmp_path, 1, job_id)["child"]["pgid"] == follower_trainer  # still training
    cli(["status", job_id], env, check=True)  # revives node 0's supervisor, which re-adopts its trainer
    wait_for(lambda: status(job_id, env)["state"] in ("succeeded", "failed"), 120, every=1, what="the end")
    st = status(job_id, env)
    assert [n["state"] for n in st["nodes"]] == ["succeeded", "succeeded"], st
    assert "leader reachable again" in (node_dir(tmp_path, 1, job_id) / "job.log").read_text()
    assert any(e["type"] == "readopted" for e in events(node_dir(tmp_path, 0, job_id)))
    assert len(node_state(tmp_path, 1, job_id).get("rollbacks") or []) == 0


def test_a_follower_gone_past_lost_after_ends_the_job_with_the_reason(tmp_path, env, index_urls):
    spec = fleet_spec(tmp_path / "job.yaml", index_urls, steps=2000, interval=0.1)
    job_id = submitted(cli(["submit", str(spec)], env, timeout=180))
    wait_for(lambda: node_state(tmp_path, 1, job_id).get("tps"), 90, what="node 1 training")
    st1 = node_state(tmp_path, 1, job_id)
    os.kill(st1["supervisor_pid"], signal.SIGKILL)  # nobody revives it (no status is asked)
    wait_for(lambda: node_state(tmp_path, 0, job_id)["state"] == "failed", 60, what="node 0 ending the job")
    reason = node_state(tmp_path, 0, job_id)["reason"]
    assert "node 1 (lab/n1) lost: no word from its supervisor" in reason, reason
    # the follower's trainer lost its peer; once revived, the follower ends too, saying why
    cli(["status", job_id], env, check=True)
    wait_for(lambda: node_state(tmp_path, 1, job_id)["state"] == "failed", 60, what="node 1 ending")
    assert "node 0" in node_state(tmp_path, 1, job_id)["reason"]


def test_on_loss_wait_the_leader_waits_and_says_so(tmp_path, env, index_urls):
    spec = fleet_spec(tmp_path / "job.yaml", index_urls, steps=120, interval=0.1,
                      nodes={"lost_after": "2s", "on_loss": "wait"})
    job_id = submitted(cli(["submit", str(spec)], env, timeout=180))
    wait_for(lambda: node_state(tmp_path, 1, job_id).get("tps"), 90, what="node 1 training")
    os.kill(node_state(tmp_path, 1, job_id)["supervisor_pid"], signal.SIGKILL)
    wait_for(lambda: "waiting for it (nodes.on_loss: wait)" in
             (node_dir(tmp_path, 0, job_id) / "job.log").read_text(), 30, what="the leader waiting")
    assert node_state(tmp_path, 0, job_id)["state"] == "training"
    cli(["status", job_id], env, check=True)  # the follower comes back
    wait_for(lambda: status(job_id, env)["state"] in ("succeeded", "failed"), 120, every=1, what="the end")
    assert [n["state"] for n in status(job_id, env)["nodes"]] == ["succeeded", "succeeded"]
    assert "node 1 (lab/n1) is back" in (node_dir(tmp_path, 0, job_id) / "job.log").read_text()


def test_a_crash_restarts_every_node_together_on_the_same_profile(tmp_path, env, index_urls):
    spec = fleet_spec(tmp_path / "job.yaml", index_urls, steps=60, interval=0.1,
                      train={"command": "python trainer.py --nnodes {nnodes} --node-rank {node_rank} "
                                        "--rdzv-endpoint {rdzv_endpoint} --steps 60 --interval 0.1",
                             "resume_args": ["--resume"], "grace": "3s",
                             "restarts": {"max": 1, "on": ["crash"]}})
    job_id = submitted(cli(["submit", str(spec)], env, timeout=180))
    wait_for(lambda: node_state(tmp_path, 1, job_id).get("tps"), 90, what="node 1 training")
    pgid = node_state(tmp_path, 1, job_id)["child"]["pgid"]
    kids = subprocess.run(["pgrep", "-g", str(pgid)], capture_output=True, text=True).stdout.split()
    for pid in [int(k) for k in kids if int(k) != pgid]:
        os.kill(pid, signal.SIGTERM)  # a crash (SIGKILL reads as the OOM killer)
    wait_for(lambda: status(job_id, env)["state"] in ("succeeded", "failed"), 120, every=1, what="the end")
    st = status(job_id, env)
    assert [n["state"] for n in st["nodes"]] == ["succeeded", "succeeded"], st
    assert len(node_state(tmp_path, 0, job_id)["restarts"]) == 1
    ev0 = events(node_dir(tmp_path, 0, job_id))
    assert [e["round"] for e in ev0 if e["type"] == "fleet_barrier"] == [0, 1]
    for rank in (0, 1):
        assert "resumed from checkpoint" in (node_dir(tmp_path, rank, job_id) / "train.log").read_text()


def test_rollback_and_stop_from_the_cli_act_on_every_node(tmp_path, env, index_urls):
    spec = fleet_spec(tmp_path / "job.yaml", index_urls, steps=2000, interval=0.1,  # slow is no breach here
                      throughput={"format": "ktok", "window": 3, "min": "1K", "failure_limit": 2,
                                  "no_data_timeout": "30s", "good_after": "1s"})
    job_id = submitted(cli(["submit", str(spec)], env, timeout=180))
    wait_for(lambda: node_state(tmp_path, 1, job_id).get("tps"), 90, what="node 1 training")
    p = cli(["rollback", job_id, "--to", "slow"], env, check=True)
    assert "relaunches all 2 nodes" in p.stdout.decode()
    wait_for(lambda: all(node_state(tmp_path, r, job_id).get("profile") == "slow"
                         and node_state(tmp_path, r, job_id).get("state") == "training" for r in (0, 1)),
             60, what="both nodes training on slow")
    assert node_state(tmp_path, 1, job_id)["rollbacks"][-1]["to"] == "slow"
    follower = cli(["rollback", job_id, "--target", "lab/n1", "--to", "fast"], env)
    assert follower.returncode == 5 and "roll it back through node 0" in follower.stderr.decode()
    pgids = [node_state(tmp_path, r, job_id)["child"]["pgid"] for r in (0, 1)]
    p = cli(["stop", job_id], env, check=True)
    assert p.stdout.decode().count(": stopped") == 2
    ps = subprocess.run(["ps", "-eo", "pgid="], capture_output=True, text=True).stdout.split()
    assert not set(map(str, pgids)) & set(ps)
    assert [n["state"] for n in status(job_id, env)["nodes"]] == ["stopped", "stopped"]


def test_a_follower_killed_whole_supervisor_and_trainer_ends_the_job_naming_it(tmp_path, env, index_urls):
    spec = fleet_spec(tmp_path / "job.yaml", index_urls, steps=2000, interval=0.1)
    job_id = submitted(cli(["submit", str(spec)], env, timeout=180))
    wait_for(lambda: node_state(tmp_path, 1, job_id).get("tps"), 90, what="node 1 training")
    st1 = node_state(tmp_path, 1, job_id)
    os.kill(st1["supervisor_pid"], signal.SIGKILL)  # the whole node at once, as a lost container
    os.killpg(st1["child"]["pgid"], signal.SIGKILL)
    wait_for(lambda: node_state(tmp_path, 0, job_id)["state"] == "failed", 60, what="node 0 ending the job")
    reason = node_state(tmp_path, 0, job_id)["reason"]
    assert "rendezvous peer lost" in reason and "node 1 (lab/n1) unreachable" in reason, reason


def test_a_controller_dead_between_the_holds_and_the_go_starts_nothing(tmp_path, env, index_urls):
    """The controller's first half, for real (every node held through gpujob.ops.fleet's own
    submit path), then it dies: the go never comes."""
    spec_path = fleet_spec(tmp_path / "job.yaml", index_urls,
                           nodes={"lost_after": "6s", "start_timeout": "3s"})
    code = (
        "import os, sys\n"
        "from gpujob.ops import fleet, submit\n"
        "from gpujob.inventory.hosts import load_inventory\n"
        "from gpujob.spec.model import load_spec\n"
        "from gpujob.ops.target import Targets\n"
        "from pathlib import Path\n"
        "spec = load_spec(sys.argv[1])\n"
        "ts = Targets(load_inventory(Path(os.environ['GPUJOB_HOSTS'])))\n"
        "targets = [ts.open(n) for n in spec.target]\n"
        "labels = [t.label for t in targets]\n"
        "for rank, t in enumerate(targets):\n"
        "    info = fleet.node_info(spec, labels, rank, '127.0.0.1', 29999, 29998)\n"
        "    submit.submit(spec, t, profile='fast', job_id='fleet-dead', clear_caches=False,\n"
        "                  progress=print, fleet=info, fleet_key='ab' * 32)\n"
        "os.kill(os.getpid(), 9)  # the controller dies before any go\n")
    p = subprocess.run([sys.executable, "-c", code, str(spec_path)], env=env, capture_output=True,
                       timeout=120, cwd=str(REPO))
    assert p.returncode == -9, p.stderr.decode()[-2000:]
    for rank in (0, 1):
        wait_for(lambda: node_state(tmp_path, rank, "fleet-dead")["state"] == "failed", 30,
                 what=f"node {rank} giving up")
        st = node_state(tmp_path, rank, "fleet-dead")
        assert ("the controller never said go within 3s" in st["reason"]
                and "nothing was started" in st["reason"])
        assert not (tmp_path / f"n{rank}" / "envs").exists()
        assert not (node_dir(tmp_path, rank, "fleet-dead") / "secrets.json").exists()
    # the containers are free again: a whole submit runs
    job_id = submitted(cli(["submit", str(fleet_spec(tmp_path / "ok.yaml", index_urls, steps=5,
                                                     interval=0.05))], env, timeout=180))
    wait_for(lambda: status(job_id, env)["state"] == "succeeded", 120, every=1, what="the next job")

