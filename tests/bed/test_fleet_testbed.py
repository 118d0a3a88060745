"""A two-node job across two "hosts" of the loopback Proxmox test bed: tb/ct200 and
tb2/ct202, each behind its own sshd, a real LXC container each, profiles from a
real package index over HTTP; the trainers rendezvous over TCP at node 0's
primary IP (asked of the container: hosts.yaml gives none) and a slow profile
is rolled back on both nodes together."""

from __future__ import annotations

import json
import os

import pytest
import yaml

from helpers import REPO, cli, cli_json, wait_for

pytestmark = pytest.mark.testbed


@pytest.fixture
def fleet_env(testbed_two_hosts, tmp_path):
    bed = testbed_two_hosts
    home = "/root/gj-fleet"
    hosts = {}
    for name, port, vmid in (("tb", bed.ports[0], bed.vmid), ("tb2", bed.ports[-1], bed.second_vmid)):
        hosts[name] = {"address": "127.0.0.1", "port": port, "user": "root",
                       "identity_file": str(bed.user_key), "known_hosts": str(bed.known_hosts),
                       "containers": {f"ct{vmid}": {"vmid": vmid, "home": home}}}
    (tmp_path / "hosts.yaml").write_text(yaml.safe_dump({"hosts": hosts}))
    env = dict(os.environ)
    env.update(GPUJOB_HOSTS=str(tmp_path / "hosts.yaml"), XDG_STATE_HOME=str(tmp_path / "state"),
               COLUMNS="200")
    yield env
    for vmid in (bed.vmid, bed.second_vmid):
        bed.container_exec("rm", "-rf", home, vmid=vmid)


def test_two_hosts_rendezvous_and_roll_back_together(testbed_two_hosts, fleet_env, index, tmp_path):
    bed = testbed_two_hosts
    spec = {
        "name": "fleet-tb",
        "target": ["tb/ct200", "tb2/ct202"],
        "sync": [{"src": str(REPO / "tests" / "data" / "fleet"), "dest": ".",
                  "exclude": ["__pycache__", "checkpoint.json"]}],
        "profiles": [
            {"name": "fast", "index_url": index["fast"], "packages": ["gpujob-demo-kernels==1.0.0+fast"]},
            {"name": "slow", "index_url": index["slow"], "packages": ["gpujob-demo-kernels==1.0.0+slow"]},
        ],
        "profile": "slow",
        "nodes": {"lost_after": "20s"},
        "train": {"command": "python3 trainer.py --nnodes {nnodes} --node-rank {node_rank} "
                             "--rdzv-endpoint {rdzv_endpoint} --steps 50 --interval 0.1",
                  "resume_args": ["--resume"], "grace": "3s"},
        "throughput": {"format": "ktok", "window": 3, "min": "20K", "failure_limit": 2,
                       "no_data_timeout": "60s", "good_after": "1s"},
        "rollback": {"fallback": ["fast"]},
    }
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    p = cli(["submit", str(path)], fleet_env, timeout=300)
    assert p.returncode == 0, p.stderr.decode()[-3000:]
    assert "its primary IP, asked" in p.stderr.decode()
    job_id = [ln for ln in p.stdout.decode().splitlines() if ln.startswith("submitted ")][0].split()[1]
    wait_for(lambda: cli_json(["status", job_id, "--json"], fleet_env)["state"] in
             ("succeeded", "failed", "stopped"), 240, every=2, what="the job's end")
    st = cli_json(["status", job_id, "--json"], fleet_env)
    assert [(n["host"], n["container"], n["state"], n["profile"]) for n in st["nodes"]] == \
        [("tb", "ct200", "succeeded", "fast"), ("tb2", "ct202", "succeeded", "fast")], st
    for vmid in (bed.vmid, bed.second_vmid):
        jdir = bed.container_path(f"/root/gj-fleet/jobs/{job_id}", vmid=vmid)
        state = json.loads((jdir / "state.json").read_text())
        assert [(r["from"], r["to"]) for r in state["rollbacks"]] == [("slow", "fast")]
        log = (jdir / "train.log").read_text()
        assert "kernels build slow" in log and "kernels build fast" in log and "resumed from" in log
    logs = cli(["logs", job_id], fleet_env, check=True).stdout.decode()
    assert "[node 0] rendezvous: node 1 joined" in logs and "[node 1] rendezvous done" in logs
    one = cli(["logs", job_id, "--node", "1"], fleet_env, check=True).stdout.decode()
    assert "[node" not in one and "I am node 1" in one
