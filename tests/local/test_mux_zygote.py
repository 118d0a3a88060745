"""The exec channel's preloaded agent (mux_server.Zygote): ``[python3, …/agent-*.pyz, …]``
is forked from the server with the agent's modules already loaded, and must behave as
the same command exec'd: argv, stdin, stdout, stderr, exit codes, timeouts."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import zipfile

import pytest

from gpujob.agent.base import protocol
from gpujob.ops.target import BOOTSTRAP, agent_zip
from gpujob.transport.local import LocalTransport
from gpujob.transport.mux import SERVER_SOURCE, MuxClient
from helpers import HANG, returns

FAKE_MAIN = '''
import json, os, sys
def main():
    args = sys.argv[1:]
    assert args[:2] == ["--home", "h"] and args[2] in ("status", "tail"), args
    args = args[3:]
    cmdline = open("/proc/self/cmdline", "rb").read().split(b"\\x00")
    if args[:1] == ["cat"]:
        sys.stdout.write(sys.stdin.read())
        return 0
    if args[:1] == ["sleep"]:
        import time; time.sleep(float(args[1])); return 0
    if args[:1] == ["boom"]:
        raise RuntimeError("boom")
    if args[:1] == ["say"]:
        sys.exit("said no")
    print(json.dumps({"argv0": sys.argv[0], "args": args,
                      "forked": any(b"F_SETPIPE_SZ" in a for a in cmdline),
                      "pgid": os.getpgid(0) == os.getpid()}))
    print("to stderr ü", file=sys.stderr)
    return int(args[0]) if args and args[0].isdigit() else 0
'''


HS = ["--home", "h", "status"]  # only the agent's short read-only commands are forked


def fake_agent(path):
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("__main__.py", "import sys\nfrom gpujob.agent.main import main\nsys.exit(main())\n")
        z.writestr("gpujob/__init__.py", "")
        z.writestr("gpujob/agent/__init__.py", "")
        z.writestr("gpujob/agent/main.py", FAKE_MAIN)
    path.write_bytes(buf.getvalue())
    return str(path)


@pytest.fixture
def mux():
    client = MuxClient(LocalTransport().open_stream([sys.executable, "-c", SERVER_SOURCE]), "test")
    assert client.wait_ready(HANG)
    yield client
    client.close()


@pytest.mark.parametrize("launcher", [False, True])
def test_a_forked_agent_is_the_same_command_exec_d(mux, tmp_path, launcher):
    pyz = fake_agent(tmp_path / "agent-abc.pyz")
    py = [sys.executable, "-c", protocol.LAUNCHER] if launcher else [sys.executable]
    for args in (["7", "a b", "ü", ""], ["0"]):
        r = mux.run([*py, pyz, *HS, *args])
        direct = LocalTransport().run([*py, pyz, *HS, *args])
        out = json.loads(r.stdout)
        assert out["forked"] and out["pgid"]  # forked from the server, in a session of its own
        assert dict(out, forked=False) == json.loads(direct.stdout)
        assert (r.exit_code, r.stderr) == (direct.exit_code, direct.stderr) == (int(args[0]),
                                                                                "to stderr ü\n".encode())
    data = bytes(range(256)).decode("latin-1").encode() * 1000
    assert mux.run([*py, pyz, *HS, "cat"], stdin=b"hello\n").stdout == b"hello\n"
    assert len(mux.run([*py, pyz, *HS, "cat"], stdin=data).stdout) == len(data)
    r = mux.run([*py, pyz, *HS, "boom"])
    assert r.exit_code == 1 and b"RuntimeError: boom" in r.stderr
    r = mux.run([*py, pyz, *HS, "say"])
    assert (r.exit_code, r.stderr) == (1, b"said no\n")
    if launcher:  # the launcher's own answer when the zip is not there (exec'd: no zip to load)
        assert mux.run([*py, str(tmp_path / "agent-gone.pyz"), *HS]).exit_code == protocol.AGENT_MISSING
    # killed at its timeout: run to its end, the call would be "hung"
    r = returns(lambda: mux.run([*py, pyz, *HS, "sleep", str(10 * HANG)], timeout=0.5),
                "a timed-out forked agent")
    assert r.timed_out and r.exit_code == 124


def test_only_one_agent_zip_and_only_this_interpreter_is_forked(mux, tmp_path):
    first = fake_agent(tmp_path / "agent-one.pyz")
    second = fake_agent(tmp_path / "agent-two.pyz")
    other_name = fake_agent(tmp_path / "tool.pyz")
    assert json.loads(mux.run([sys.executable, first, *HS]).stdout)["forked"]
    # another agent command (one that may run for long, seen in ps as itself): exec'd
    assert not json.loads(mux.run([sys.executable, first, "--home", "h", "tail"]).stdout)["forked"]
    assert not json.loads(mux.run([sys.executable, second, *HS]).stdout)["forked"]  # exec'd: still right
    assert not json.loads(mux.run([sys.executable, other_name, *HS]).stdout)["forked"]
    assert json.loads(mux.run([sys.executable, first, *HS]).stdout)["forked"]


def test_the_real_agent_forked_answers_as_exec_d(mux, tmp_path):
    dest = tmp_path / "bin" / "agent-real.pyz"
    subprocess.run([sys.executable, "-c", BOOTSTRAP, str(dest)], input=agent_zip()[0], check=True)
    for py in ([sys.executable], [sys.executable, "-c", protocol.LAUNCHER]):  # Target.agent_argv's shape
        argv = [*py, str(dest), "--home", str(tmp_path / "home"), "status"]
        r, direct = mux.run(argv), LocalTransport().run(argv)
        assert (r.exit_code, r.stdout, r.stderr) == (direct.exit_code, direct.stdout, direct.stderr)
        assert r.exit_code == 0 and json.loads(r.stdout)["jobs"] == []
