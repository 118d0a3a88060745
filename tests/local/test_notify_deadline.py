"""The notify deadline (issue 35 rows 6 and 7; agent/supervisor/notify.py): the spec's
``notify[*].deadline`` validated and shown in the plan, and real jobs on the ``local``
target whose first webhook stalls (tests/local/test_notify_isolated.py's loopback endpoints):
the supervisor leaves once the deadline gave its messages up, and its SIGKILL while one
stalls leaves nothing running. No duration is asserted: messages and attempts are
counted, waits are bounded generously."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

from gpujob.agent.base.proc import stat_fields
from gpujob.agent.home.journal import Home, Journal
from gpujob.agent.supervisor import notify
from helpers import cli, cli_json, events, job_id_of, local_env, wait_for, write_spec
from test_notify import HookServer
from test_notify_isolated import RawHook, outbox, servers  # noqa: F401 (a fixture)


# ---- the spec's deadline --------------------------------------------------------------

@pytest.mark.parametrize("block, message", [
    ("notify:\n  - url: https://h/x\n    deadline: 5s\n",
     "job.yaml:7: notify[0].deadline: expected at least the timeout (10s)"),
    ("notify:\n  - url: https://h/x\n    timeout: 1s\n    deadline: 2h\n",
     "job.yaml:8: notify[0].deadline: expected a duration of at least 1s and at most 1h"),
    ("notify:\n  - url: https://h/x\n    timeout: 0.5s\n    deadline: 0.5s\n",
     "job.yaml:8: notify[0].deadline: expected a duration of at least 1s and at most 1h"),
    ("notify:\n  - url: https://h/x\n    deadline: soon\n", "job.yaml:7: notify[0].deadline:"),
])
def test_a_bad_deadline_is_one_line_with_file_and_line(tmp_path, block, message):
    from gpujob.errors import SpecError
    from gpujob.spec.model import load_spec
    from test_notify import BASE
    (tmp_path / "job.yaml").write_text(BASE + block)
    with pytest.raises(SpecError) as e:
        load_spec(tmp_path / "job.yaml")
    assert "\n" not in str(e.value) and message in str(e.value), str(e.value)


def test_the_plan_shows_each_webhooks_attempt_timeout_and_deadline(tmp_path, index_urls):
    env = local_env(tmp_path)
    spec = write_spec(tmp_path / "job.yaml", target="box", fast_url=index_urls["fast"],
                      slow_url=index_urls["slow"],
                      notify=[{"url": "https://ntfy.sh/t", "format": "ntfy", "timeout": "3s",
                               "deadline": "45s"},
                              {"url": "https://hooks.example/j"}])
    p = cli(["submit", str(spec), "--plan", "--job-id", "tjob-plan"], env)
    assert p.returncode == 0, p.stderr.decode()
    out = " ".join(p.stdout.decode().split())
    assert "its own sender; 3s an attempt, 5 retries with backoff, given up 45s after it was queued" in out
    assert "its own sender; 10s an attempt, 5 retries with backoff, given up 120s after it was queued" in out


# ---- a job's supervisor and a stalled webhook ---------------------------------------

def jdir(tmp_path: Path, job_id: str) -> Path:
    return tmp_path / "root" / "jobs" / job_id


def alive(pid: int) -> bool:
    fields = stat_fields(pid)
    return bool(fields) and fields[0] not in ("Z", "X")


def left_running(root: Path, sessions: set) -> list:
    """Live processes of the job: in one of the supervisors' sessions, or naming its root."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        fields = stat_fields(int(entry))
        if not fields or fields[0] in ("Z", "X"):
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmd = f.read()
        except OSError:
            continue
        if int(fields[3]) in sessions or os.fsencode(str(root)) in cmd:
            found.append((int(entry), cmd.replace(b"\0", b" ")[:200]))
    return found


def stalled_job(tmp_path: Path, index_urls: dict, drip: RawHook, ok: HookServer) -> tuple:
    """(env, job id) of a short job whose first webhook stalls (2s an attempt, 20 retries,
    8s a message) and whose second is healthy."""
    env = local_env(tmp_path)
    spec = write_spec(tmp_path / "job.yaml", target="box", fast_url=index_urls["fast"],
                      slow_url=index_urls["slow"], profile="fast", warmup=False, throughput=False,
                      trainer_args="--steps 3 --interval 0.01",
                      notify=[{"url": drip.url, "timeout": "2s", "retries": 20, "deadline": "8s"},
                              {"url": f"{ok.url}/ok"}])
    p = cli(["submit", str(spec), "--follow"], env, timeout=180)
    assert p.returncode == 0, p.stdout.decode()[-3000:] + p.stderr.decode()[-2000:]
    return env, job_id_of(p.stdout)


def test_a_stalled_webhook_does_not_hold_the_supervisor_past_the_notify_deadline(tmp_path, index_urls,
                                                                                 servers):
    drip, ok = servers("drip"), servers("healthy")
    env, job_id = stalled_job(tmp_path, index_urls, drip, ok)
    d = jdir(tmp_path, job_id)
    st = json.loads((d / "state.json").read_text())
    assert st["state"] == "succeeded"
    pid = st["supervisor_pid"]
    # the healthy one has both messages while the slow one still stalls
    wait_for(lambda: len(ok.ids("/ok")) == 2, 60, what="known_good and success on the healthy webhook")
    assert [i.split(".")[1] for i in ok.ids("/ok")] == ["known_good", "success"]
    # the supervisor leaves once the deadline has given the slow one's messages up: with 20
    # retries left, each cut at its timeout (without a deadline it would stay for all of them)
    wait_for(lambda: not alive(pid), 120, what="the supervisor to leave after its job's end")
    recs = {i.split(".")[1]: r for i, r in outbox(Journal(Home(str(tmp_path / "root")), job_id)).items()}
    assert sorted(recs) == ["known_good", "success"]
    for r in recs.values():
        assert (r["acked"], r["failed"], r["pending"]) == ([1], [0], [])
        assert 1 <= r["attempts"]["0"] < 21
    given_up = [e for e in events(d) if e["type"] == "notify_error" and e["gave_up"]]
    assert [e["webhook"] for e in given_up] == [0, 0]
    assert all("deadline" in e["error"] for e in given_up), given_up
    assert drip.counts()[0] == sum(r["attempts"]["0"] for r in recs.values())
    wait_for(lambda: drip.counts()[1] == 0, 30, what="the slow webhook's connection to close")
    assert cli_json(["status", job_id, "--json"], env)["notify"] == \
        {"waiting": 0, "sent": 0, "given_up": [f"{job_id}.known_good.fast.0", f"{job_id}.success.end"],
         "dropped": 0}
    assert left_running(tmp_path / "root", {pid}) == []


def test_a_supervisor_killed_while_a_webhook_stalls_leaves_nothing_running(tmp_path, index_urls, servers):
    drip, ok = servers("drip"), servers("healthy")
    env, job_id = stalled_job(tmp_path, index_urls, drip, ok)
    d = jdir(tmp_path, job_id)
    pid = json.loads((d / "state.json").read_text())["supervisor_pid"]
    wait_for(lambda: any(e["type"] == "notify_queued" and ".success." in e["id"] for e in events(d)), 30,
             what="the success message")
    wait_for(lambda: drip.counts()[1] >= 1, 30, what="an attempt stalled on the slow webhook")
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: not alive(pid), 30, what="the supervisor to die")
    # nothing of the job runs, and the stalled connection is gone with the supervisor
    assert left_running(tmp_path / "root", {pid}) == []
    wait_for(lambda: drip.counts()[1] == 0, 30, what="the stalled connection to close")
    assert notify.waiting(str(d))
    # status revives a supervisor for what waits; it too leaves by its deadline, the messages given up
    revived = cli_json(["status", job_id, "--json"], env)
    assert revived["state"] == "succeeded"
    new = wait_for(lambda: (json.loads((d / "state.json").read_text())["supervisor_pid"] != pid
                            and json.loads((d / "state.json").read_text())["supervisor_pid"]), 30,
                   what="the revived supervisor")
    wait_for(lambda: not alive(new), 120, what="the revived supervisor to leave")
    assert not notify.waiting(str(d))
    assert left_running(tmp_path / "root", {pid, new}) == []
    recs = outbox(Journal(Home(str(tmp_path / "root")), job_id))
    assert all(r["failed"] == [0] and r["attempts"]["0"] < 21 for r in recs.values())
    assert sorted(i.split(".")[1] for i in ok.ids("/ok")) == ["known_good", "success"]
    wait_for(lambda: drip.counts()[1] == 0, 30, what="the revived supervisor's connection to close")
