"""Issue 24, item 4: frictions a newcomer hit, each as it behaves now."""

from __future__ import annotations

import json
import os
import subprocess

from helpers import REPO, cli, gpujob_argv, local_env


def test_a_closed_pipe_ends_the_command_quietly_with_exit_0(tmp_path):
    env = local_env(tmp_path)
    for args in (["hosts"], ["--help"], ["hosts", "--json"]):
        p = subprocess.Popen([*gpujob_argv(), *args], env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, cwd=str(REPO))
        p.stdout.close()  # the reader (head -2) is gone before the first line
        err = p.stderr.read().decode()
        assert p.wait(timeout=60) == 0 and err == "", (args, err)


def test_under_json_an_error_is_one_json_object_with_its_exit_code(tmp_path):
    env = local_env(tmp_path)
    p = cli(["--json", "exec", "nope", "true"], env, timeout=60)
    lines = p.stderr.decode().splitlines()
    assert p.returncode == 2 and len(lines) == 1, lines
    body = json.loads(lines[0])
    assert body["code"] == 2 and body["error"].startswith("unknown target 'nope'")
    p = cli(["status", "--json", "--bogus"], env, timeout=60)
    assert p.returncode == 2 and json.loads(p.stderr.decode()) == {
        "error": "No such option: --bogus (try 'gpujob status --help')", "code": 2}
    p = cli(["exec", "nope", "--", "tool", "--json"], env, timeout=60)  # the remote command's --json
    assert p.returncode == 2 and p.stderr.decode().startswith("gpujob: unknown target")


def test_without_hosts_yaml_the_unknown_target_says_where_it_looked(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("GPUJOB_HOSTS", "XDG_CONFIG_HOME")}
    env.update(HOME=str(tmp_path / "home"), XDG_STATE_HOME=str(tmp_path / "state"),
               GPUJOB_TEST_CWD=str(tmp_path))
    p = cli(["exec", "ct200", "true"], env, timeout=60)
    err = p.stderr.decode()
    assert p.returncode == 2 and err.count("\n") == 1, err
    # the user's first (issue 34)
    assert (f"unknown target 'ct200'; known: demo (no hosts.yaml found (looked in "
            f"{tmp_path}/home/.config/gpujob/hosts.yaml, {tmp_path}/hosts.yaml); using the built-in "
            f"inventory; give --hosts FILE or set $GPUJOB_HOSTS)") in err
    (tmp_path / "h.yaml").write_text("hosts:\n  l:\n    kind: local\n    containers:\n      box: {root: r}\n")
    p = cli(["--hosts", str(tmp_path / "h.yaml"), "exec", "ct200", "true"], env, timeout=60)
    assert p.returncode == 2 and "no hosts.yaml found" not in p.stderr.decode()


def test_the_ssh_banner_error_says_what_usually_causes_it(tmp_path):
    import socket
    import threading

    from gpujob.errors import ConnectError
    from gpujob.transport.ssh_config import SshSettings
    from gpujob.transport.ssh import connect
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)

    def serve():  # accepts, then hangs up without a word: not an sshd
        conn, _ = server.accept()
        conn.close()
    threading.Thread(target=serve, daemon=True).start()
    settings = SshSettings(hostname="127.0.0.1", port=server.getsockname()[1], user="root", identity_files=[],
                           known_hosts=tmp_path / "kh", proxy_jump=None, connect_timeout=5, keepalive=0)
    try:
        connect(settings)
    except ConnectError as e:
        assert "Error reading SSH protocol banner" in e.message and e.exit_code == 3
        assert e.hint.startswith("the port answered but not with SSH: usually the wrong port")
    else:
        raise AssertionError("connected to something that is not an sshd")
    finally:
        server.close()


def test_ctrl_c_in_submit_says_what_it_left_and_the_job_id(tmp_path):
    import signal
    import time

    env = local_env(tmp_path)
    (tmp_path / "root").mkdir()
    spec = tmp_path / "job.yaml"
    spec.write_text("name: cc\ntarget: box\nprofiles:\n  - {name: a, system_site_packages: true}\n"
                    "train: {command: sleep 60, grace: 1s}\n")
    for attempt in range(3):  # on a loaded machine the submit can end before the signal lands: again
        p = subprocess.Popen([*gpujob_argv(), "submit", str(spec)], env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=str(REPO),
                             start_new_session=True)
        err = b""
        deadline = time.monotonic() + 120
        while b"starting the supervisor" not in err and time.monotonic() < deadline:
            line = p.stderr.readline()
            if not line:
                break
            err += line
        assert b"starting the supervisor" in err, err
        # at once: the agent's submit is under way (it takes a Python start and more)
        os.kill(p.pid, signal.SIGINT)  # the CLI only: over ssh the container's agent never sees a Ctrl-C
        rest = p.stderr.read().decode()
        rc = p.wait(timeout=60)
        if rc != 0:
            break
        out = p.stdout.read().decode()  # submitted before the signal: stop that job, try again
        done = next((w for w in out.split() if w.startswith("cc-")), None)
        assert done, out
        assert cli(["stop", done], env, timeout=120).returncode == 0
    assert rc == 130, rest
    lines = [ln for ln in rest.splitlines() if ln.strip() and not ln.startswith("·")]
    assert len(lines) == 1 and lines[0].startswith("gpujob: interrupted "), rest
    job_id = next(w for w in lines[0].split() if w.startswith("cc-"))
    if "goes on" in lines[0]:  # the supervisor took the request: it says how to reach it
        assert f"gpujob logs -f {job_id}" in lines[0] and f"gpujob stop {job_id}" in lines[0], lines[0]
        assert cli(["stop", job_id], env, timeout=120).returncode == 0
    else:  # the local agent ended with the CLI: what the line says is what the container has
        assert f"job {job_id} is not (yet) on lab/box; look again with gpujob status {job_id}" in lines[0]
        assert not list((tmp_path / "root").glob(f"**/jobs/{job_id}/state.json"))
