"""`submit --resume-from JOB` of a job over two nodes on the `local` kind (two gpujob homes on
this machine): each node resolves JOB in its own container and copies its own checkpoint of it
into this job's fixed place before its trainer starts; a node without one refuses the whole
submit. The real CLI, real supervisors, the fleet trainer of test_fleet_local.py."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from helpers import cli, cli_json, events
from test_fleet_local import env, fleet_spec, node_dir, status, submitted  # noqa: F401 (env: a fixture)



def test_resume_from_a_job_copies_its_checkpoint_into_each_nodes_own_place(tmp_path, env, index_urls):
    # the fleet trainer resumes from checkpoint.json in its workdir (a fixed place): `submit
    # --resume-from A` of a job of another name (another workdir) copies, on each node, that node's
    # own checkpoint of A into this job's place before the node's trainer starts (after the barrier)
    ck = {"path": "checkpoint.json", "every": "20s", "settle": "1s"}
    a_spec = fleet_spec(tmp_path / "a.yaml", index_urls, steps=20, interval=0.05)
    a_doc = yaml.safe_load(a_spec.read_text())
    a_doc["train"]["checkpoint"] = ck
    a_spec.write_text(yaml.safe_dump(a_doc, sort_keys=False))
    a = submitted(cli(["submit", str(a_spec), "--follow"], env, timeout=180))
    assert [n["state"] for n in status(a, env)["nodes"]] == ["succeeded", "succeeded"]
    b_spec = fleet_spec(tmp_path / "b.yaml", index_urls, steps=30, interval=0.05, name="fleetb")
    b_doc = yaml.safe_load(b_spec.read_text())
    b_doc["train"]["checkpoint"] = ck
    b_spec.write_text(yaml.safe_dump(b_doc, sort_keys=False))
    plan = cli(["submit", str(b_spec), "--resume-from", a, "--plan"], env)
    assert plan.returncode == 0, plan.stderr.decode()
    shown = plan.stdout.decode()
    assert shown.count(f"resuming on purpose from {a} (submit --resume-from): its checkpoint copied into "
                       "this job's checkpoint.json first") == 2  # one a node
    p = cli(["submit", str(b_spec), "--resume-from", a, "--follow"], env, timeout=180)
    b = submitted(p)
    assert p.returncode == 0, p.stdout.decode()[-3000:]
    assert [n["state"] for n in status(b, env)["nodes"]] == ["succeeded", "succeeded"]
    for rank in (0, 1):
        d = node_dir(tmp_path, rank, b)
        assert "resumed from checkpoint at step 20" in (d / "train.log").read_text()
        ev = events(d)
        copied = [e for e in ev if e["type"] == "start_copied"]
        assert len(copied) == 1, [e["type"] for e in ev]
        src, dest = copied[0]["src"], copied[0]["dest"]
        assert copied[0]["job"] == a  # this node's own checkpoint of A, in A's workdir (its name's)
        assert src.startswith(str(tmp_path / f"n{rank}")) and src.endswith("/fleet/checkpoint.json")
        assert dest.startswith(str(tmp_path / f"n{rank}")) and dest.endswith("/fleetb/checkpoint.json")
        # the copy is made before this node's trainer starts; on the leader, after its first barrier
        # (every node joined): a node that could not join never copies
        kinds = [e["type"] for e in ev]
        assert kinds.index("start_copied") < kinds.index("job_env")
        if rank == 0:
            assert kinds.index("start_copied") > kinds.index("fleet_barrier")
        # A's own checkpoint was read, never rewritten: still step 20
        assert json.loads(Path(src).read_text())["step"] == 20


def test_resume_from_a_job_one_node_lacks_is_refused_and_nothing_starts(tmp_path, env, index_urls):
    # a job that ran on node 0's container alone: node 1 has no such job, so it refuses, node 0 is
    # released, and the whole submit is refused in one line with no job left to see
    solo = tmp_path / "solo.yaml"
    solo.write_text(yaml.safe_dump({
        "name": "solo", "target": "lab/n0", "profiles": [{"name": "p", "system_site_packages": True}],
        "train": {"command": "python -c \"import json, time; json.dump({'step': 5}, open('checkpoint.json', "
                             "'w')); time.sleep(3)\"",
                  "checkpoint": {"path": "checkpoint.json", "every": "20s", "settle": "1s"}},
        "throughput": None}, sort_keys=False))
    p = cli(["submit", str(solo), "--follow"], env, timeout=180)
    assert p.returncode == 0, p.stdout.decode()[-2000:] + p.stderr.decode()[-2000:]
    c = submitted(p)
    spec = fleet_spec(tmp_path / "b.yaml", index_urls, steps=30, interval=0.05, name="fleetb")
    doc = yaml.safe_load(spec.read_text())
    doc["train"]["checkpoint"] = {"path": "checkpoint.json", "every": "20s", "settle": "1s"}
    spec.write_text(yaml.safe_dump(doc, sort_keys=False))
    r = cli(["submit", str(spec), "--resume-from", c], env, timeout=180)
    err = r.stderr.decode()
    assert r.returncode != 0 and "Traceback" not in err
    assert f"node 1 (lab/n1) could not start: --resume-from {c}: no such checkpoint" in err, err
    assert "nothing started on any node" in err
    assert [v["job"] for v in cli_json(["ps", "--json"], env)] == [c]
    for rank in (0, 1):
        jobs = tmp_path / f"n{rank}" / "jobs"
        for d in (jobs.iterdir() if jobs.exists() else []):
            if d.name.startswith("fleetb-"):
                assert json.loads((d / "state.json").read_text())["state"] not in ("training", "warmup")
    assert not list((tmp_path / "n0" / "work").glob("fleetb/checkpoint.json"))
