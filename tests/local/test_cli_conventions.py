"""The command line's conventions (issue 12, item 4), through the real ``gpujob`` entry
point as a subprocess: one-line usage errors with a hint, flags shown as flags, global
options after the command, shell completion, every documented exit code, --json on
every command (JSON Lines for streams), no hard wrapping when piped, whole ids at 80
columns, doctor's fixes and summary."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import yaml

from gpujob.ops.wheelhouse import build_indexes
from helpers import REPO, local_env, write_spec

GPUJOB = str(Path(sys.executable).parent / "gpujob")
LONG_ID = "conventions-long-job-id-0123456789abcdef"
COMMANDS = ["exec", "doctor", "hosts", "submit", "logs", "status", "plot", "ps", "stop", "rollback",
            "profiles", "gc", "demo", "completion", "cache ls", "cache clear", "cache restore",
            "cache prove-cold", "ledger set"]


def run(args, env, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([GPUJOB, *args], env=env, capture_output=True, cwd=str(REPO),
                          timeout=kw.pop("timeout", 180), **kw)


def run_tty(args, env, cols: int = 80) -> str:
    """``gpujob ARGS`` on a real terminal (a pty) ``cols`` wide; its output without colours."""
    import fcntl
    import pty
    import struct
    import termios
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, cols, 0, 0))
    env = {k: v for k, v in env.items() if k not in ("COLUMNS", "LINES")}
    p = subprocess.Popen([GPUJOB, *args], env=env, stdout=slave, stderr=subprocess.DEVNULL, cwd=str(REPO))
    os.close(slave)
    buf = b""
    try:
        while True:
            try:
                data = os.read(master, 65536)
            except OSError:  # EIO: the other side is closed
                break
            if not data:
                break
            buf += data
    finally:
        os.close(master)
        p.wait(timeout=60)
    return re.sub(r"\x1b\[[0-9;?]*[a-zA-Z]", "", buf.decode()).replace("\r\n", "\n")


def one_line(p) -> str:
    text = p.stderr.decode()
    assert "Traceback" not in text and p.stdout == b"", text
    lines = [ln for ln in text.splitlines() if not ln.startswith("  hint:")]
    assert len(lines) == 1, text
    return lines[0]


@pytest.fixture(scope="module")
def box(tmp_path_factory):
    """A local target with one finished job of a long id (fast profile: no rollback)."""
    tmp = tmp_path_factory.mktemp("conv")
    idx = {b: p.as_uri() for b, p in build_indexes(tmp / "wheelhouse").items()}
    env = local_env(tmp)
    env.pop("COLUMNS")
    spec = write_spec(tmp / "job.yaml", target="box", fast_url=idx["fast"], slow_url=idx["slow"],
                      profile="fast", trainer_args="--steps 12 --interval 0.01")
    p = run(["submit", str(spec), "--job-id", LONG_ID, "--follow", "--json"], env)
    assert p.returncode == 0, p.stdout.decode()[-2000:] + p.stderr.decode()[-2000:]
    recs = [json.loads(ln) for ln in p.stdout.decode().splitlines()]  # JSON Lines: start, log, end
    assert recs[0]["job_id"] == LONG_ID and recs[-1]["state"] == "succeeded"
    assert {"line": "training finished at step 12"} in recs[1:-1]
    return {"env": env, "tmp": tmp, "spec": spec, "idx": idx}


# ---- usage errors --------------------------------------------------------------------

@pytest.mark.parametrize("args, expect", [
    (["logs", "--folow"],
     "gpujob: No such option: --folow (Possible options: --follow) (try 'gpujob logs --help')"),
    (["exec", "box", "ls", "-la"], "gpujob: No such option: -l (put '--' before the command: "
                                   "gpujob exec TARGET -- COMMAND [ARGS...])"),
    (["logs", "--tail", "x"], "(try 'gpujob logs --help')"),
    (["nosuch"], "gpujob: No such command 'nosuch'. (try 'gpujob --help')"),
    (["cache", "ls"], "gpujob: Missing argument 'target'. (try 'gpujob cache ls --help')"),
    (["completion", "tcsh"], "gpujob: completion: expected bash, zsh or fish, got 'tcsh'"),
])
def test_usage_errors_are_one_line_with_a_hint_and_exit_2(box, args, expect):
    p = run(args, box["env"])
    assert p.returncode == 2
    line = one_line(p)
    assert line.startswith("gpujob: ") and expect in line, line


def test_no_command_prints_the_help_and_exits_2(box):
    p = run([], box["env"])
    assert p.returncode == 2 and b"Usage: gpujob" in p.stdout + p.stderr and b"Traceback" not in p.stderr


@pytest.mark.parametrize("cmd", COMMANDS)
def test_help_shows_flags_as_flags_and_json_everywhere(box, cmd):
    p = run([*cmd.split(), "--help"], dict(box["env"], COLUMNS="200"))
    out = p.stdout.decode()
    assert p.returncode == 0 and "Usage: gpujob " + cmd in out
    assert "<bool>" not in out
    assert re.search(r"--json\s", out), f"{cmd} has no --json"
    assert "--hosts" in out  # the global options, accepted after the command too


def test_flags_keep_their_value_types(box):
    out = run(["logs", "--help"], dict(box["env"], COLUMNS="200")).stdout.decode()
    assert re.search(r"--follow\s+-f\s+follow", out) and re.search(r"--tail\s+-n\s+<int>", out)


# ---- global options after the command ----------------------------------------------

def test_global_options_after_the_command(box, tmp_path):
    env = dict(box["env"])
    hosts = env.pop("GPUJOB_HOSTS")
    other = tmp_path / "other.yaml"
    other.write_text(yaml.safe_dump({"hosts": {"elsewhere": {"kind": "local", "containers": {
        "far": {"root": str(tmp_path / "far")}}}}}))
    before = json.loads(run(["--hosts", hosts, "hosts", "--check", "--json"], env).stdout)
    after = json.loads(run(["hosts", "--check", "--json", "--hosts", hosts], env).stdout)
    assert before == after and after["path"] == hosts
    # after the command it wins over the environment's inventory
    p = run(["hosts", "--json", "--hosts", str(other)], box["env"])
    assert [r["container"] for r in json.loads(p.stdout)["targets"]] == ["far"]
    p = run(["cache", "ls", "far", "--hosts", str(tmp_path / "missing.yaml")], box["env"])
    assert p.returncode == 2 and "--hosts: no such file: " in one_line(p) and "missing.yaml" in one_line(p)
    p = run(["exec", "box", "--accept-new", "--", "true"], box["env"])
    assert p.returncode == 0, p.stderr
    # after `--` it is the command's: passed through untouched
    p = run(["exec", "box", "--", "echo", "--hosts", "x", "--accept-new"], box["env"])
    assert (p.returncode, p.stdout) == (0, b"--hosts x --accept-new\n")


# ---- completion ----------------------------------------------------------------------

def test_bash_completion_script_completes_commands_and_options(box):
    bash = shutil.which("bash")
    assert bash, "bash is needed for this test"
    env = dict(box["env"], PATH=f"{Path(GPUJOB).parent}:{box['env']['PATH']}")
    script = ('eval "$(gpujob completion bash)"\n'
              'for words in "gpujob lo" "gpujob logs --fo" "gpujob cache c"; do\n'
              '  read -ra COMP_WORDS <<< "$words"; COMP_CWORD=$(( ${#COMP_WORDS[@]} - 1 ))\n'
              '  _gpujob_completion gpujob; echo "${COMPREPLY[*]}"\ndone\n')
    p = subprocess.run([bash, "--norc", "-c", script], env=env, capture_output=True, timeout=60)
    assert p.stdout.decode().splitlines() == ["logs", "--follow", "clear"], p.stderr.decode()


@pytest.mark.parametrize("shell, word", [("zsh", '"logs"'), ("fish", "logs\t")])
def test_zsh_and_fish_scripts_and_their_call_back(box, shell, word):
    script = run(["completion", shell], box["env"]).stdout.decode()
    assert f"_GPUJOB_COMPLETE=complete_{shell}" in script
    env = dict(box["env"], _GPUJOB_COMPLETE=f"complete_{shell}", _TYPER_COMPLETE_ARGS="gpujob lo",
               _TYPER_COMPLETE_FISH_ACTION="get-args")
    assert word in run([], env).stdout.decode()
    assert json.loads(run(["completion", shell, "--json"], box["env"]).stdout)["script"] == \
        script.rstrip("\n")


# ---- exit codes (README: "Exit codes") -------------------------------------------------

def banner_server():
    """Something on a port that is not sshd: it answers HTTP to everyone."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen()

    def serve():
        while True:
            try:
                c, _ = srv.accept()
            except OSError:
                return
            c.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n")
            c.close()

    threading.Thread(target=serve, daemon=True).start()
    return srv


def ssh_hosts(tmp_path, port: int) -> Path:
    path = tmp_path / "ssh-hosts.yaml"
    path.write_text(yaml.safe_dump({"hosts": {"far": {
        "address": "127.0.0.1", "port": port, "user": "root", "connect_timeout": 5,
        "known_hosts": str(tmp_path / "known_hosts"), "containers": {"ct9": {"vmid": 900}}}}}))
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_every_documented_exit_code(box, tmp_path):
    env = box["env"]
    assert run(["exec", "box", "--", "true"], env).returncode == 0
    # 1: a failed doctor check (and a followed job that failed)
    srv = banner_server()
    try:
        p = run(["--hosts", str(ssh_hosts(tmp_path, srv.getsockname()[1])), "doctor"], env)
    finally:
        srv.close()
    assert p.returncode == 1, p.stdout.decode() + p.stderr.decode()  # a followed job that failed: below
    # 2: bad input
    assert run(["logs", "--phase", "bogus"], env).returncode == 2
    # 3: cannot connect
    p = run(["--hosts", str(ssh_hosts(tmp_path, free_port())), "exec", "ct9", "--", "true"], env)
    assert p.returncode == 3 and "connection refused" in one_line(p)
    # 4: a remote step failed (the agent cannot be shipped: its home is under a file)
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({"hosts": {"lab": {"kind": "local", "containers": {
        "box": {"root": "/dev/null/gpujob"}}}}}))
    p = run(["--hosts", str(bad), "profiles", "box"], env)
    assert p.returncode == 4 and "shipping the gpujob agent" in one_line(p)
    # 5: refused
    p = run(["status", "no-such-job-here"], env)
    assert p.returncode == 5, p.stderr
    # 124: exec --timeout; the command's own code otherwise
    assert run(["exec", "box", "--timeout", "0.5", "--", "sleep", "30"], env).returncode == 124
    assert run(["exec", "box", "--", "sh", "-c", "exit 7"], env).returncode == 7


def test_a_followed_job_that_fails_exits_1(box, tmp_path):
    spec = write_spec(tmp_path / "fail.yaml", target="box", fast_url=box["idx"]["fast"],
                      slow_url=box["idx"]["slow"], profile="fast", warmup=False, name="failjob",
                      train={"command": "exit 3"})
    p = run(["submit", str(spec), "--follow"], box["env"])
    assert p.returncode == 1, p.stdout.decode()[-1500:]


def test_ctrl_c_exits_130(box):
    """SIGINT (what Ctrl-C sends) to a running `exec`: the remote command ends, exit 130."""
    p = subprocess.Popen([GPUJOB, "exec", "box", "-n", "--", "sh", "-c", "echo started; exec sleep 60"],
                         env=box["env"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=str(REPO))
    try:
        assert p.stdout.readline() == b"started\n"
        p.send_signal(signal.SIGINT)
        assert p.wait(timeout=120) == 130  # a hang guard: on a loaded 2-core machine the cancel takes long
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
        p.stdout.close()
        p.stderr.close()


# ---- --json: JSON Lines for streams ----------------------------------------------------

def jsonl(p) -> list:
    assert p.returncode == 0, p.stderr.decode()
    return [json.loads(ln) for ln in p.stdout.decode().splitlines()]


def test_json_lines_for_streams(box):
    env = box["env"]
    ev = jsonl(run(["logs", LONG_ID, "--events", "--json"], env))
    assert ev and all("type" in r and "t" in r for r in ev) and ev[-1]["state"] == "succeeded"
    samples = jsonl(run(["logs", LONG_ID, "--samples", "--json"], env))
    assert samples and {r["type"] for r in samples} == {"sample"}
    lines = jsonl(run(["logs", LONG_ID, "-f", "--json"], env))  # follow: ends with the job
    assert lines[-1] == {"line": lines[-1]["line"]} and "job succeeded" in lines[-1]["line"]
    assert any(r["line"] == "training finished at step 12" for r in lines)
    tail = jsonl(run(["logs", LONG_ID, "--phase", "train", "-n", "1", "--json"], env))
    assert tail == [{"line": "training finished at step 12"}]
    ex = jsonl(run(["exec", "box", "--json", "--", "sh", "-c", "printf 'h\\303\\251\\n'; echo e >&2"], env))
    assert {"stream": "stdout", "data": "hé\n"} in ex and {"stream": "stderr", "data": "e\n"} in ex
    assert ex[-1] == {"exit_code": 0, "timed_out": False}


def test_json_on_the_other_commands(box):
    env = box["env"]
    assert run(["--json", "ps"], env).stdout == run(["ps", "--json"], env).stdout  # a global option too
    assert jsonl(run(["--json", "logs", LONG_ID, "--events"], env))[-1]["state"] == "succeeded"
    plan = json.loads(run(["submit", str(box["spec"]), "--plan", "--json"], env).stdout)
    assert plan["target"] == "lab/box" and any(s["kind"] == "train" for s in plan["steps"])
    assert LONG_ID in [r["job"] for r in json.loads(run(["ps", "--json"], env).stdout)]
    assert json.loads(run(["status", LONG_ID, "--json"], env).stdout)["state"] == "succeeded"
    assert json.loads(run(["plot", LONG_ID, "--json"], env).stdout)["points"]
    ls = json.loads(run(["cache", "ls", "box", "--json"], env).stdout)
    assert ls["caches"]
    cleared = json.loads(run(["cache", "clear", "box", "-p", "fast", "--json"], env).stdout)
    assert cleared["cleared"]
    restored = run(["cache", "restore", "box", "-p", "fast", "--json"], env)
    assert restored.returncode in (0, 5) and (restored.returncode == 5
                                              or json.loads(restored.stdout)["restored"])


# ---- output: piped, narrow ------------------------------------------------------------

def test_piped_output_is_never_hard_wrapped(box):
    out = run(["logs", LONG_ID, "--events"], box["env"]).stdout.decode()  # piped, no COLUMNS
    lines = out.splitlines()
    assert max(len(ln) for ln in lines) > 100  # long records: a wrap at 80 would show
    assert all(re.match(r"\d\d:\d\d:\d\d \S", ln) for ln in lines), [ln for ln in lines
                                                                     if not re.match(r"\d\d:", ln)]
    st = run(["status", LONG_ID], box["env"]).stdout.decode()
    assert st.count(LONG_ID) == 1


def test_ids_are_whole_at_80_columns(box):
    out = run_tty(["ps"], box["env"])
    assert LONG_ID in out and "…" not in out.split(LONG_ID)[0][-5:]
    assert max(len(ln) for ln in out.splitlines()) <= 80
    st = run_tty(["status", LONG_ID], box["env"])
    assert LONG_ID in st
    keys = {c["env_key"]
            for c in json.loads(run(["cache", "ls", "box", "--json"], box["env"]).stdout)["caches"]}
    for args in (["status", LONG_ID], ["cache", "ls", "box"], ["profiles", "box"], ["hosts"]):
        out = run_tty(args, box["env"])
        assert "…" not in out and max(len(ln) for ln in out.splitlines()) <= 80, (args, out)
        if args[0] != "status" and args[0] != "hosts":
            assert all(k in out for k in keys), out  # venv keys whole


# ---- doctor -----------------------------------------------------------------------------

def test_doctor_gives_a_fix_for_every_failure_and_a_summary(box, tmp_path):
    srv = banner_server()
    try:
        hosts = ssh_hosts(tmp_path, srv.getsockname()[1])
        with open(hosts, "a") as f:  # and the local box: ok and warn checks beside the failure
            f.write(f"  lab:\n    kind: local\n    containers:\n      box: {{root: {box['tmp'] / 'root'}}}\n")
        p = run(["doctor", "--hosts", str(hosts)], box["env"])
        narrow = run_tty(["doctor", "--hosts", str(hosts)], box["env"])
        report = json.loads(run(["doctor", "--json", "--hosts", str(hosts)], box["env"]).stdout)
    finally:
        srv.close()
    out = p.stdout.decode()
    assert p.returncode == 1, out
    assert re.search(r"┃ check\s+┃ status\s+┃ detail\s+┃ fix", narrow)
    assert "…" not in narrow and max(len(ln) for ln in narrow.splitlines()) <= 80  # folds, not cut
    [row] = [ln for ln in out.splitlines() if "Error reading SSH protocol banner" in ln]
    # the error's own hint (transport/ssh.py) names what usually causes it
    assert "the port answered but not with SSH: usually the wrong port" in row and "ssh -v -p PORT" in row
    checks = [c for cs in report.values() for c in cs]
    assert all(c["hint"] for c in checks if c["status"] != "ok")
    n = {s: sum(c["status"] == s for c in checks) for s in ("ok", "warn", "fail")}
    assert out.rstrip().splitlines()[-1] == f"{n['ok']} ok, {n['warn']} warn, {n['fail']} fail"
    assert n["fail"] == 1 and n["ok"] >= 1
