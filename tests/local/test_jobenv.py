"""The job environment: the login environment, never the CLI's own variables, plus
the inventory's pass-through patterns, the spec's env and the venv first on PATH."""

from __future__ import annotations

import json
import os

import yaml

from gpujob.agent.base import jobenv
from helpers import cli, job_id_of, wait_for, write_spec, cli_json


def test_job_env_layers_and_never_list():
    login = {"PATH": "/usr/bin", "HOME": "/root", "PYTHONPATH": "/x", "VIRTUAL_ENV": "/v", "LANG": "C"}
    env = jobenv.job_env(login, {"NCCL_X": "1"}, [{"A": 1}, {"A": "2", "B": "b"}], "/j/venv", {"C": "c"})
    assert env["PATH"] == "/j/venv/bin:/usr/bin" and env["VIRTUAL_ENV"] == "/j/venv"
    assert "PYTHONPATH" not in env and env["A"] == "2" and env["NCCL_X"] == "1" and env["C"] == "c"
    assert jobenv.passed_through({"NCCL_A": "1", "NCCLX": "2", "LD_LIBRARY_PATH": "/l", "X": "3"},
                                 ["NCCL_*", "LD_LIBRARY_PATH"]) == {"NCCL_A": "1", "LD_LIBRARY_PATH": "/l"}


def test_login_env_is_a_clean_login_shell():
    env, source = jobenv.login_env({"HOME": os.environ.get("HOME", "/root"), "PYTHONPATH": "/leak",
                                    "SECRET_OF_THE_CLI": "1"})
    assert source == "login shell" and env["PATH"]
    assert "PYTHONPATH" not in env and "SECRET_OF_THE_CLI" not in env


def test_local_job_sees_no_cli_variables_but_the_passthrough(tmp_path):
    from gpujob.ops.wheelhouse import build_indexes
    idx = {b: p.as_uri() for b, p in build_indexes(tmp_path / "wh").items()}
    hosts = tmp_path / "hosts.yaml"
    box = {"root": str(tmp_path / "root"), "env_passthrough": ["KEEP_ME"]}
    hosts.write_text(yaml.safe_dump({"hosts": {"lab": {"kind": "local", "env_passthrough": ["NCCL_*"],
                                                       "containers": {"box": box}}}}))
    env = dict(os.environ, GPUJOB_HOSTS=str(hosts), XDG_STATE_HOME=str(tmp_path / "state"), COLUMNS="200",
               PYTHONPATH="/cli/only", VIRTUAL_ENV="/cli/venv", NCCL_NVLS_ENABLE="0", KEEP_ME="yes",
               CLI_LEAK="1")
    spec = write_spec(tmp_path / "job.yaml", target="box", fast_url=idx["fast"], slow_url=idx["slow"],
                      profile="fast", warmup=False, throughput=False, env={"FROM_SPEC": "s"},
                      train={"command": "python -c 'import os, json; print(\"ENV\" + "
                                        "json.dumps(dict(os.environ)))'"})
    plan = cli(["submit", str(spec), "--plan"], env, check=True).stdout.decode()
    assert "pass-through NCCL_*, KEEP_ME" in plan.replace("\n", " ")
    p = cli(["submit", str(spec), "--follow"], env, timeout=120)
    assert p.returncode == 0, p.stdout.decode()[-2000:] + p.stderr.decode()[-2000:]
    job = job_id_of(p.stdout)
    line = next(ln for ln in (tmp_path / "root" / "jobs" / job / "train.log").read_text().splitlines()
                if ln.startswith("ENV"))
    seen = json.loads(line[3:])
    assert "PYTHONPATH" not in seen and "CLI_LEAK" not in seen
    assert seen["VIRTUAL_ENV"].endswith(f"jobs/{job}/venv")
    assert seen["PATH"].split(":")[0] == seen["VIRTUAL_ENV"] + "/bin"
    assert seen["NCCL_NVLS_ENABLE"] == "0" and seen["KEEP_ME"] == "yes" and seen["FROM_SPEC"] == "s"
    assert seen["TORCHINDUCTOR_CACHE_DIR"].startswith(str(tmp_path / "root" / "caches"))
    assert wait_for(lambda: cli_json(["status", job, "--json"], env)["state"] == "succeeded", 30)


def test_a_login_profile_that_prints_noise_still_gives_the_login_env(tmp_path):
    """Issue 35 row 11: a real bash login shell whose ~/.bash_profile prints (a motd, an echo,
    no newline at the end) still hands its environment over; one that prints none says why."""
    from gpujob.agent.base.jobenv import login_env
    home = tmp_path / "home"
    home.mkdir()
    (home / ".bash_profile").write_text('printf "Welcome to CT 200 = hi"\nexport PATH=/opt/gj/bin:$PATH\n'
                                        'export GJ_FROM_PROFILE=yes\necho noise\n')
    env, where = login_env({"HOME": str(home), "USER": "u", "LOGNAME": "u"})
    assert where == "login shell", where
    assert env["GJ_FROM_PROFILE"] == "yes" and env["PATH"].startswith("/opt/gj/bin:")
    assert not any("Welcome" in k or "noise" in k for k in env)
    (home / ".bash_profile").write_text('echo "no env for you" >&2\nexit 3\n')
    env, where = login_env({"HOME": str(home), "USER": "u", "LOGNAME": "u"})
    assert where.startswith("fallback (exit 3, printed no environment; it said: no env for you)"), where
