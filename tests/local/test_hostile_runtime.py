"""Issue 10, past the loader: substitutions into shell commands, terminal output of
outside text, unreachable targets, exec's stdin, known_hosts oddities, modes and
memory of the shipped tar."""

from __future__ import annotations

import io
import os
import stat
import shlex
import subprocess
import sys
import tarfile
import textwrap
from types import SimpleNamespace

import paramiko
import pytest
import yaml

from gpujob.agent.verbs.files import untar
from gpujob.agent.base.placeholders import command_argv, placeholder_env, quoted_placeholders
from gpujob.show import render
from gpujob.errors import HostKeyError
from gpujob.ops.tarstream import Concat, TarStream
from gpujob.transport.ssh import load_known_hosts
from helpers import REPO, cli, gpujob_argv, local_env

HOSTILE = ["/root/a b", "/root/x;touch PWN;#", "$(touch PWN)", "`touch PWN`", "a'b\"c", "new\nline", "-n",
           "*", "~", "$HOME", "\\", "x&&touch PWN", "'", "", " lead", "{workdir}", "ünï ✓"]


@pytest.mark.parametrize("key", ["workdir", "gpu", "profile", "job_id", "gpus.all"])
def test_hostile_values_reach_the_shell_as_one_word(tmp_path, key):
    pwn = tmp_path / "pwned"
    for raw in HOSTILE:
        value = raw.replace("PWN", str(pwn))
        for command in (f"printf '%s' {{{key}}} > out.txt", f"cd . && printf %s {{{key}}}>out.txt"):
            argv = command_argv(command, {key: value})
            assert argv[:2] in (["/bin/bash", "-c"], ["/bin/sh", "-c"])
            subprocess.run(argv, cwd=tmp_path, check=True)
            assert (tmp_path / "out.txt").read_text() == value, (command, value)
        # an argv list is no shell: the value goes in as it is; but bash -c SCRIPT is
        assert command_argv(["echo", f"--x={{{key}}}"], {key: value}) == ["echo", f"--x={value}"]
        argv = command_argv(["bash", "-c", f"printf %s {{{key}}} > out.txt", f"{{{key}}}"], {key: value})
        assert argv[3] == value
        subprocess.run(argv, cwd=tmp_path, check=True)
        assert (tmp_path / "out.txt").read_text() == value
        assert not pwn.exists(), value
    env = placeholder_env({key: "v"})
    assert env == {f"GPUJOB_{key.replace('.', '_').upper()}": "v"}


def test_quoted_placeholders_are_found():
    assert quoted_placeholders("cd '{workdir}' && x") == ["{workdir}"]
    assert quoted_placeholders('x --out "{workdir}/o" --p {profile}') == ["{workdir}"]
    assert quoted_placeholders("cd {workdir} && echo 'hi' \"{x}\" \\' {gpu}") == []
    assert quoted_placeholders("echo \"it's\" {gpus.all}") == []


MARKUP = ["[/bold]", "[rank0]: loss 1.2", "[red]x[/", ":100:", "[link=http://x]y", "\x1b[31mesc", "a\nb"]


def _render(renderable) -> str:
    console = render.console()
    console.file = io.StringIO()
    console.width = 300
    console.print(renderable)
    return console.file.getvalue()


def _shown(text: str) -> str:  # what a piece of outside text looks like once shown (control chars escaped)
    return text.replace("\x1b", "\\x1b").replace("\n", "\\n")


def test_every_render_path_shows_outside_text_literally():
    for text in MARKUP:
        st = {"job_id": f"j{text}", "name": text, "state": "failed", "phase": text, "profile": f"p{text}",
              "tps": 1000.0, "tps_recent": [1.0, 2.0], "started_at": 1.0, "finished_at": 2.0, "reason": text,
              "exit_code": 1, "window": {"median": 1.0, "threshold": 2.0, "threshold_source": text},
              "rollbacks": [{"decided_at": 1.0, "from": text, "to": "b", "signal": text, "reason": text}],
              "ledger": {"profiles": {text: {"status": "bad", "reason": text, "baseline": 5.0}}}}
        view = render.status_view(st, f"t{text}")
        console = render.console()
        console.file = io.StringIO()
        console.width = 300
        render.print_status(console, view)
        shown = console.file.getvalue()
        assert _shown(text) in shown and "\x1b[31m" not in shown
        unreachable = render.status_view({"job_id": "j1", "state": "unreachable", "reason": text}, "far/ct")
        out = _render(render.ps_table([view, unreachable]))
        assert "unreachable" in out and _shown(text) in out
        out = _render(render.hosts_table([{"host": text, "container": "c", "status": "unreachable",
                                           "error": text},
                                          {"host": "h", "container": text, "status": "running",
                                                            "vmid": 200, "job": text}], text))
        assert _shown(text) in out
        check = SimpleNamespace(name=text, status="fail", detail=text, hint=text)
        assert _shown(text) in _render(render.doctor_table(text, [check]))
        assert _shown(text) in _render(render.ledger_table({text: {"status": "good", "reason": text}}))
        step = SimpleNamespace(kind=text, where=text, what=text, when=text, argv=["echo", text])
        assert all(_render(line) for line in render.plan_lines(text, [step]))
        assert _shown(text) in _render(render.lit(render.event_line({"t": 1, "type": "note", "text": text})))


@pytest.fixture
def far_env(tmp_path):
    """A local target (lab/box) and an ssh host nobody answers on (far/ct)."""
    env = local_env(tmp_path)
    inv = yaml.safe_load(open(env["GPUJOB_HOSTS"]))
    inv["hosts"]["far"] = {"address": "127.0.0.1", "port": 1, "user": "root", "connect_timeout": 3,
                           "known_hosts": str(tmp_path / "kh"), "containers": {"ct": {"vmid": 200}}}
    with open(env["GPUJOB_HOSTS"], "w") as f:
        yaml.safe_dump(inv, f)
    return env


def test_ps_hosts_doctor_with_an_unreachable_target(tmp_path, far_env):
    code = ("import sys; from gpujob.ops.state import State; s = State(); "
            "s.reserve('x-aaaa', 'x', 'far/ct', '/j.yaml', 'h', 'p'); "
            "s.reserve('y-[/]b', 'y', 'lab/box', '/j.yaml', 'h', 'p'); s.close()")
    subprocess.run([sys.executable, "-c", code], env=far_env, check=True, cwd=str(REPO))
    p = cli(["ps"], far_env, timeout=60)
    assert p.returncode == 0, p.stderr.decode()
    out = p.stdout.decode()
    # the far host is a row of its own; the local container answers: it has no such job, and the
    # row's submit (the process above) is gone, so it was never started: said in one line, literally
    assert "x-aaaa" in out and out.count("unreachable") == 1
    assert "gpujob: y-[/]b was never started" in p.stderr.decode(), p.stderr.decode()
    p = cli(["hosts"], far_env, timeout=60)
    assert p.returncode == 0, p.stderr.decode()
    assert ("far/ct" in p.stdout.decode() and "unreachable" in p.stdout.decode()
            and "lab/box" in p.stdout.decode())
    p = cli(["doctor"], far_env, timeout=60)
    assert p.returncode == 1 and b"Traceback" not in p.stderr
    assert "gpujob doctor: far/ct" in p.stdout.decode() and "connection refused" in p.stdout.decode()
    assert "gpujob doctor: lab/box" in p.stdout.decode()


def test_exec_with_an_idle_open_stdin_returns_the_exit_code(tmp_path):
    env = local_env(tmp_path)
    p = subprocess.Popen([*gpujob_argv(), "exec", "box", "--", "sh", "-c", "exit 7"],
                         env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         cwd=str(REPO))
    try:
        p.wait(timeout=30)  # stdin stays open and idle all along
        err = p.stderr.read()
    finally:
        if p.poll() is None:
            p.kill()
        p.stdin.close()
    assert p.returncode == 7 and b"Fatal Python error" not in err, err


def test_exec_no_stdin_leaves_a_read_loop_its_input(tmp_path):
    env = local_env(tmp_path)
    gj = shlex.join(gpujob_argv())
    loop = textwrap.dedent(f"""\
        printf 'a\\nb\\nc\\n' | while read x; do {gj} exec -n box -- true; echo "got $x"; done
        printf 'a\\nb\\n' | {{ {gj} exec box -- cat; }}""")
    p = subprocess.run(["bash", "-c", loop], env=env, capture_output=True, timeout=120, cwd=str(REPO))
    assert p.returncode == 0, p.stderr.decode()
    assert p.stdout.decode() == "got a\ngot b\ngot c\na\nb\n"


def test_known_hosts_oddities_are_one_line(tmp_path):
    blob = "AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl"
    kh = tmp_path / "known_hosts"
    kh.write_text(f"# comment\nhost1 ssh-ed25519 {blob}\n@revoked * ssh-ed25519 {blob}\n"
                  f"@cert-authority *.lan ssh-ed25519 {blob}\n{paramiko.HostKeys.hash_host('h2')} "
                  f"ssh-ed25519 {blob}\n")
    client = paramiko.SSHClient()
    assert load_known_hosts(client, kh) == {blob}
    # a revoked key is known nowhere (issue 24): paramiko then asks the policy, which refuses it
    assert client.get_host_keys().lookup("host1") is None and client.get_host_keys().lookup("h2") is None
    kh.write_text(f"host1 ssh-ed25519 {blob}\n{paramiko.HostKeys.hash_host('h2')} ssh-ed25519 {blob}\n")
    client = paramiko.SSHClient()
    assert load_known_hosts(client, kh) == frozenset()
    assert client.get_host_keys().lookup("host1") is not None
    assert client.get_host_keys().lookup("h2") is not None
    for bad, where in (("h ssh-rsa !!!notbase64\n", ":1:"), ("@weird * ssh-ed25519 x\n", ":1:"),
                       (f"|1|abc=|def= ssh-ed25519 {blob}\n", ":1:"),
                       (f"ok ssh-ed25519 {blob}\n@revoked\n", ":2:")):
        kh.write_text(bad)
        with pytest.raises(HostKeyError) as e:
            load_known_hosts(paramiko.SSHClient(), kh)
        assert where in e.value.message and "\n" not in e.value.message and e.value.exit_code == 3
    kh.write_bytes(b"\xff\xfe h")
    with pytest.raises(HostKeyError, match="not UTF-8"):
        load_known_hosts(paramiko.SSHClient(), kh)


def test_setuid_bits_never_ship(tmp_path, monkeypatch):
    src = tmp_path / "src"
    src.mkdir()
    (src / "run.sh").write_text("#!/bin/sh\n")
    os.chmod(src / "run.sh", 0o4755)
    (src / "sticky").write_text("x")
    os.chmod(src / "sticky", 0o3775)
    stream = TarStream(src, ["run.sh", "sticky"])
    data = stream.read()
    assert len(data) == stream.size and stream.read() == b""
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        assert {m.name: m.mode for m in tar} == {"run.sh": 0o755, "sticky": 0o775}
        assert tar.extractfile("run.sh").read() == b"#!/bin/sh\n"
    # the agent masks too, also on a Python without tarfile's data filter (Debian 12's 3.11.2)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        info = tarfile.TarInfo("evil")
        info.mode, info.size = 0o6755, 2
        tar.addfile(info, io.BytesIO(b"hi"))
    monkeypatch.delattr(tarfile, "data_filter")
    dest = tmp_path / "dest"
    assert untar(io.BytesIO(buf.getvalue()), len(buf.getvalue()), str(dest)) == 1
    assert stat.S_IMODE(os.stat(dest / "evil").st_mode) == 0o755


def test_streaming_tar_keeps_laptop_memory_flat(tmp_path):
    """Ship 200 MB (a sparse file: reading it costs no disk) through the local transport
    the way submit does; its peak RSS must stay far under the size (the in-memory tar
    took 2.2x the size). VmHWM, not ru_maxrss: that one also counts the forked pytest."""
    size = 200 << 20
    src = tmp_path / "code"
    src.mkdir()
    with open(src / "big.bin", "wb") as f:
        f.truncate(size)
    (src / "small.py").write_text("print(1)\n")
    script = textwrap.dedent("""\
        import re, sys
        from pathlib import Path
        from gpujob.ops.tarstream import Concat, TarStream
        from gpujob.transport.local import LocalTransport
        hwm = lambda: int(re.search(r'VmHWM:\\s+(\\d+)', open('/proc/self/status').read())[1]) // 1024
        tar = TarStream(Path(sys.argv[1]), ["big.bin", "small.py"])
        r = LocalTransport().run(["sh", "-c", "wc -c"], stdin=Concat([b'{"job": 1}\\n', tar]))
        print(tar.size, int(r.stdout.split()[0]), hwm())
    """)
    p = subprocess.run([sys.executable, "-c", script, str(src)], capture_output=True, timeout=300,
                       cwd=str(REPO))
    assert p.returncode == 0, p.stderr.decode()
    tar_size, received, rss_mb = map(int, p.stdout.split())
    print(f"\nstreamed {received >> 20} MiB with a peak RSS of {rss_mb} MiB")
    assert received == tar_size + len(b'{"job": 1}\n') and tar_size > size
    assert rss_mb < 50, rss_mb


def test_concat_starts_over():
    parts = Concat([b"ab", b"", b"cd"])
    assert parts.read(3) + parts.read(3) + parts.read(3) == b"abcd"
    parts.seek(0)
    assert parts.read(10) == b"ab"


def test_agent_refuses_a_relative_dest_outside_the_workdir(tmp_path):
    """The controller refuses it at load; the agent checks again before unpacking anything."""
    import json
    req = {"job_id": "x-aaaa", "spec": {"name": "x"}, "profile": "p", "env_keys": {"p": "p-0"},
           "spec_hash": "h", "sync_streams": [{"dest": "../../escaped", "size": 0}]}
    p = subprocess.run([sys.executable, "-m", "gpujob.agent.main", "--home", str(tmp_path / "home"),
                        "submit"],
                       input=json.dumps(req).encode() + b"\n", capture_output=True, timeout=60, cwd=str(REPO))
    assert p.returncode == 1 and "resolves outside the workdir" in p.stdout.decode()
    assert not (tmp_path / "home" / "escaped").exists() and not (tmp_path / "escaped").exists()
    from gpujob.agent.home.lock import Lock
    assert Lock(str(tmp_path / "home")).holder() is None  # released
    assert not (tmp_path / "home" / "jobs" / "x-aaaa").exists()  # nothing written


def test_the_manifest_looks_only_at_the_names_asked(tmp_path, monkeypatch):
    """The container's manifest answers for the files the controller has, not for what the
    trainer wrote beside them (a workdir of 100k outputs once made that answer pass the
    controller's 8 MiB cap); a name that is not a plain relative path is not looked at."""
    from gpujob.agent.verbs import files
    root = tmp_path / "w"
    (root / "sub").mkdir(parents=True)
    (root / "train.py").write_text("print()")
    (root / "sub" / "m.py").write_text("x = 1")
    for i in range(500):
        (root / f"out-{i}.bin").write_text("o")
    (tmp_path / "secret").write_text("s")
    os.symlink(tmp_path / "secret", root / "link.py")
    got = files.manifest(str(root), ["train.py", "sub/m.py", "gone.py", "../secret", "/etc/passwd",
                                     "sub", "link.py", "", 7])
    assert set(got) == {"train.py", "sub/m.py"}
    assert got["train.py"][0] == len("print()")
