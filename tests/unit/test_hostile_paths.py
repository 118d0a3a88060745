"""Issue 24, item 3: control characters in paths and names, FIFOs behind
{from_file}, webhook URLs that do not parse, textfile placeholders. Each case is
one line with file:line, exit 2, never a traceback or a hang."""

from __future__ import annotations

import os
import socket

import pytest

from gpujob.inventory.hosts import load_inventory
from helpers import cli, local_env
from test_hostile_input import SPEC, edit, spec_error

INVENTORY = "hosts:\n  pve:\n    address: h\n    containers:\n      ct: {vmid: 200}\n"


@pytest.mark.parametrize("old, new, where", [
    ("workdir: /root/w", 'workdir: "/root/w\\nrm -rf /"',
     "job.yaml:3: workdir: cannot hold a control character (found \\n)"),
    ("{src: code, dest: code}", '{src: "co\\0de", dest: code}',
     "job.yaml:5: sync[0].src: cannot hold a control character (found \\x00)"),
    ("{src: code, dest: code}", '{src: code, dest: "co\\rde"}',
     "job.yaml:5: sync[0].dest: cannot hold a control character (found \\r)"),
    ("command: python t.py", 'command: python t.py\n  checkpoint: {path: "ck/\\x1b[2J*.pt", every: 1m}',
     "job.yaml:13: train.checkpoint.path: cannot hold a control character (found \\x1b)"),
    ("throughput: {format: ktok, min: 10K, window: 5}",
     'throughput: {source: file, path: "m\\n.jsonl", field: t, min: 1}',
     "job.yaml:14: throughput.path: cannot hold a control character (found \\n)"),
    ("throughput:", 'metrics: {textfile: "/var/lib/x\\n.prom"}\nthroughput:',
     "job.yaml:14: metrics.textfile: cannot hold a control character (found \\n)"),
    ("throughput:", 'metrics: {textfile: "/var/lib/{jobid}.prom"}\nthroughput:',
     "job.yaml:14: metrics.textfile: unknown placeholder {jobid}"),
    ("throughput:", 'requirements: ["numpy\\n--index-url http://evil"]\nthroughput:',
     "job.yaml:14: requirements[0]: expected a requirement"),
    ("packages: [torch==1]}", 'packages: [torch==1], python: "/usr/bin/python3\\tx"}',
     "job.yaml:10: profiles[0].python: expected an interpreter path"),
])
def test_control_characters_in_spec_paths_are_one_line(tmp_path, old, new, where):
    msg = spec_error(tmp_path, edit(old, new))
    assert msg.startswith(where), msg


@pytest.mark.parametrize("field, value", [
    ("home", '"/root/x\\ntouch /tmp/P #"'), ("root", '"/srv/\\x00x"'), ("pct", '"pct\\rx"'),
    ("identity_file", '"~/.ssh/id\\n"'), ("user", '"root\\nx"'), ("address", '"h\\n-oProxyCommand=x"'),
])
def test_control_characters_in_hosts_yaml_are_one_line(tmp_path, field, value):
    if field in ("home", "root"):
        text = INVENTORY.replace("{vmid: 200}", f"{{vmid: 200, {field}: {value}}}")
        line, where = 5, f"hosts.pve.containers.ct.{field}"
    else:
        text = INVENTORY.replace("    address: h\n", "    address: h\n" if field == "address" else
                                 f"    address: h\n    {field}: {value}\n")
        if field == "address":
            text = text.replace("address: h", f"address: {value}")
        line, where = 3 if field == "address" else 4, f"hosts.pve.{field}"
    msg = spec_error(tmp_path, text, load_inventory)
    assert msg.startswith(f"job.yaml:{line}: {where}: cannot hold a control character"), msg


def test_a_nul_in_sync_src_is_one_line_exit_2(tmp_path):
    env = local_env(tmp_path)
    spec = tmp_path / "job.yaml"
    spec.write_text(SPEC.replace("{src: code, dest: code}", '{src: "co\\0de", dest: code}'))
    p = cli(["submit", str(spec), "--plan"], env, timeout=60)
    err = p.stderr.decode()
    assert p.returncode == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith(f"gpujob: {spec}:5: sync[0].src: cannot hold a control character (found \\x00)")


def _special(tmp_path, kind: str) -> str:
    path = str(tmp_path / kind)
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "socket":
        s = socket.socket(socket.AF_UNIX)
        s.bind(path)  # left bound for the test's life: closed with the process
        _special.keep = s
    else:
        return "/dev/zero"
    return path


@pytest.mark.parametrize("kind, what",
                         [("fifo", "a FIFO"), ("socket", "a socket"), ("dev", "a character device")])
def test_from_file_reads_regular_files_only(tmp_path, kind, what):
    env = local_env(tmp_path)
    path = _special(tmp_path, kind)
    spec = tmp_path / "job.yaml"
    spec.write_text(edit("HF_HOME: /root/hf", f"HF_TOKEN: {{from_file: {path}}}"))
    p = cli(["submit", str(spec), "--plan"], env, timeout=30)  # a FIFO blocked here forever
    err = p.stderr.decode()
    assert p.returncode == 2 and err.count("\n") == 1, err
    assert f"{spec}:8: env.HF_TOKEN: from_file: {path} is {what}, not a regular file" in err


@pytest.mark.parametrize("url, why", [
    ('"https://hooks.example/x\\nX-Evil: 1"', "a URL cannot hold a control character"),
    ('"https://hooks.example/a b"', "a URL cannot hold a control character or a space"),
    ('"https://[::1/x"', "not a URL that can be parsed"),
    ('"https://h:99999/x"', "not a URL that can be parsed"),
    ('"https:///x"', "the URL names no host"),
])
def test_notify_urls_are_validated_at_submit(tmp_path, url, why):
    msg = spec_error(tmp_path, SPEC + f"notify:\n  - url: {url}\n")
    assert msg.startswith("job.yaml:16: notify[0].url: " + why) and "hooks.example" not in msg, msg


def test_a_notify_url_from_a_file_is_validated_too(tmp_path):
    env = local_env(tmp_path)
    (tmp_path / "url").write_text("https://\n")
    spec = tmp_path / "job.yaml"
    spec.write_text(SPEC + f"notify:\n  - url: {{from_file: {tmp_path / 'url'}}}\n")
    p = cli(["submit", str(spec), "--plan"], env, timeout=30)
    err = p.stderr.decode()
    assert p.returncode == 2 and \
        f"{spec}:16: notify[0].url: from {tmp_path / 'url'}: the URL names no host" in err, err
