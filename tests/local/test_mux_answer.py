"""A ``status`` that only reads is answered inside the exec channel's server (the agent's
``answer``, called by mux_server.Zygote) without forking a child: the same bytes and exit
code as the command exec'd; a job whose supervisor would be restarted still goes the forked
way (it spawns a process, which must not be the server's child); and the server killed
mid-answer is one clear line, after which the next command works on a new channel."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from gpujob.agent import main as agent_main
from gpujob.agent.base import protocol
from gpujob.errors import ConnectionLost
from gpujob.ops.target import BOOTSTRAP, agent_zip
from gpujob.transport.local import LocalTransport
from gpujob.transport import mux_server
from gpujob.transport.stacked import Stacked
from test_mux import mux  # noqa: F401 (the exec channel's server on a local pipe)

pytestmark = pytest.mark.skipif(shutil.which("python3") is None, reason="the exec channel runs python3")


class EnvOver(Stacked):
    def host_argv(self, argv):
        return ["env", "--", *argv]


def install_agent(tmp_path):
    dest = tmp_path / "bin" / "agent-real.pyz"
    subprocess.run([sys.executable, "-c", BOOTSTRAP, str(dest)], input=agent_zip()[0], check=True)
    return str(dest)


def job(home, job_id, **state):
    d = home / "jobs" / job_id
    d.mkdir(parents=True)
    (d / "job.json").write_text(json.dumps({"job_id": job_id, "spec": {"name": "demo"}, "profile": "fast",
                                            "submitted_at": 1.0, "by": "me@laptop"}))
    (d / "state.json").write_text(json.dumps(state))


def without_now(stdout: bytes) -> dict:
    out = json.loads(stdout)
    for st in out.get("jobs", []):
        st.pop("now", None)
    return out


@pytest.fixture
def home(tmp_path):
    h = tmp_path / "home"
    job(h, "done-1", state="succeeded", step="succeeded", started_at=10.0, finished_at=25.0, profile="fast")
    job(h, "odd-2", state="failed", started_at=10.0, finished_at=12.0, reason="exit 3 ü")
    return h




def test_answer_prints_what_main_prints(home, capsys):
    args = ["--home", str(home), "status", "--missing-ok", "done-1", "odd-2", "never-3"]
    code, out, err = agent_main.answer(args)
    assert capsys.readouterr() == ("", "")  # nothing reached the real stdout (the server's frames)
    assert code == agent_main.main(args) == 0
    assert without_now(out.encode()) == without_now(capsys.readouterr().out.encode()) and err == ""
    # a missing id without --missing-ok: the same refusal line and exit code
    code, out, _ = agent_main.answer(["--home", str(home), "status", "never-3"])
    assert code == protocol.REFUSED and "no job never-3" in json.loads(out)["error"]
    for no in (["status"], ["status", "--bogus", "x"], ["status", "--help"], ["tail", "done-1"],
               ["status", *[f"j{i}" for i in range(agent_main.ANSWER_MAX_JOBS + 1)]]):
        assert agent_main.answer(["--home", str(home), *no]) is None  # the forked way
    assert capsys.readouterr() == ("", "")
    fds = len(os.listdir("/proc/self/fd"))  # the server lives long: no descriptor left open an answer
    for _ in range(50):
        agent_main.answer(args)
    assert len(os.listdir("/proc/self/fd")) == fds


def test_a_job_whose_supervisor_died_goes_the_forked_way_and_is_revived(home, mux, tmp_path):
    job(home, "orphan-4", state="running", step="train", started_at=10.0, supervisor_pid=999999999)
    args = ["--home", str(home), "status", "--missing-ok", "orphan-4"]
    assert agent_main.answer(args) is None
    assert agent_main.answer(["--home", str(home), "status", "--no-revive", "orphan-4"]) is not None
    r = mux.run([sys.executable, install_agent(tmp_path), *args])
    st = json.loads(r.stdout)["jobs"][0]
    assert r.exit_code == 0 and st["revived"]["revived"] is True  # forked: its child spawned the supervisor


def test_the_server_answers_status_as_the_command_exec_d(home, mux, tmp_path):
    pyz = install_agent(tmp_path)
    for py in ([sys.executable], [sys.executable, "-c", protocol.LAUNCHER]):  # Target.agent_argv's shape
        for ids in (["--missing-ok", "done-1", "odd-2", "never-3"], ["never-3"], ["--no-revive", "odd-2"]):
            argv = [*py, pyz, "--home", str(home), "status", *ids]
            r, direct = mux.run(argv), LocalTransport().run(argv)
            assert (r.exit_code, r.stderr) == (direct.exit_code, direct.stderr)
            assert without_now(r.stdout) == without_now(direct.stdout)
            assert r.stdout.endswith(b"\n") and r.stdout.count(b"\n") == 1


def test_the_server_killed_mid_answer_is_one_line_and_the_next_command_works(home, tmp_path):
    marker = tmp_path / "died"
    env = dict(os.environ, GPUJOB_TEST_DIE_AT=f"status_answer@{marker}")
    place = EnvOver(LocalTransport(env=env), "box")
    pyz = install_agent(tmp_path)
    argv = ["python3", "-c", protocol.LAUNCHER, pyz, "--home", str(home), "status", "--missing-ok", "done-1"]
    try:
        assert place.run(["true"]).exit_code == 0  # the channel is up before the answer kills it
        with pytest.raises(ConnectionLost) as e:
            place.run(argv)
        assert marker.exists()  # it died in the answer, not elsewhere
        said = str(e.value)
        assert "\n" not in said and "lost" in said and "box" in said
        r = place.run(argv)  # a new channel; the fault fires once
        assert r.exit_code == 0 and json.loads(r.stdout)["jobs"][0]["state"] == "succeeded"
    finally:
        place.close()


def test_an_answer_that_raises_even_systemexit_is_left_to_the_forked_way(monkeypatch):
    for boom in (SystemExit(3), RuntimeError("x"), KeyboardInterrupt()):
        def answer(argv, boom=boom):
            raise boom
        monkeypatch.setattr(agent_main, "answer", answer)
        assert mux_server.Zygote.answer(["python3", "agent-x.pyz", "--home", "h", "status", "j"]) is None
