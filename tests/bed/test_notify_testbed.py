"""Notifications and metrics on the loopback Proxmox test bed: the supervisor in a
real LXC container posts to an HTTP server of the test (the containers share the
host's network, so 127.0.0.1 reaches it), and a supervisor killed inside the
container with a refused message in its outbox sends it once revived."""

from __future__ import annotations

import json

import pytest

from helpers import cli, cli_json, job_id_of, wait_for, write_spec
from test_jobs_testbed import bed_env, home_path  # noqa: F401 (fixtures)
from test_notify import SECRET_PATH, HookServer, parse_prom

pytestmark = pytest.mark.testbed


@pytest.fixture
def hooks():
    h = HookServer()
    yield h
    h.close()


def test_a_container_supervisor_notifies_and_resends_after_a_kill(testbed, bed_env, tmp_path, index,  # noqa: F811
                                                                  hooks):
    env = dict(bed_env, HOOK_URL=f"{hooks.url}/slack/{SECRET_PATH}")
    hooks.down.add("/json")
    spec = write_spec(tmp_path / "job.yaml", target="ct200", fast_url=index["fast"], slow_url=index["slow"],
                      trainer_args="--steps 90 --interval 0.1", rollback={"fallback": ["fast"]},
                      notify=[{"url": {"from_env": "HOOK_URL"}, "format": "slack"},
                              {"url": f"{hooks.url}/json", "events": ["known_good", "success"],
                               "retries": 20}],
                      metrics={"every": "1s"})
    job_id = job_id_of(cli(["submit", str(spec)], env, check=True, timeout=300).stdout)
    d = home_path(testbed, env, "jobs", job_id)

    def events():
        return [json.loads(ln) for ln in (d / "events.jsonl").read_text().splitlines() if ln.strip()]
    wait_for(lambda: any(e["type"] == "notify_error" and ".known_good." in e.get("id", "") for e in events()),
             180, what="a refused known_good message")
    pid = json.loads((d / "state.json").read_text())["supervisor_pid"]
    assert testbed.container_exec("kill", "-9", str(pid)).returncode == 0
    hooks.down.clear()
    assert cli_json(["status", job_id, "--json"], env)["state"] == "training"  # revived, re-adopted
    wait_for(lambda: json.loads((d / "state.json").read_text()).get("state") == "succeeded", 120,
             what="the job to succeed")
    wait_for(lambda: len(hooks.ids("/json")) == 2, 60, what="known_good and success on the json hook")
    assert [i.split(".")[1] for i in hooks.ids("/json")] == ["known_good", "success"]
    slack = f"/slack/{SECRET_PATH}"
    wait_for(lambda: len(hooks.ids(slack)) == 3, 30, what="three slack messages")
    assert [i.split(".")[1] for i in hooks.ids(slack)] == ["rollback", "known_good", "success"]
    assert [set(json.loads(p["body"])) for p in hooks.received(slack)] == [{"text"}] * 3
    # the secret URL: nowhere in the job's files in the container once its messages are out
    wait_for(lambda: not (d / "secrets.json").exists(), 30, what="the webhook secret to leave")
    text = "".join(p.read_text(errors="replace") for p in d.rglob("*") if p.is_file())
    assert SECRET_PATH not in text
    prom = parse_prom((d / "metrics.prom").read_text())  # the default place: the job dir
    state = {dict(k[1])["state"]: v for k, v in prom.items() if k[0] == "gpujob_state"}
    assert state["succeeded"] == 1 and sum(state.values()) == 1
    assert [v for k, v in prom.items() if k[0] == "gpujob_rollbacks_total"] == [1]
