"""Issue 10, specs and inventories: each case the issue lists, as it behaves now.

Every load runs in a forked child with 2 CPU-s and +200 MB (tests/limits.py): on
the old loader the alias bomb and the 100,000-key env are killed as a hang instead
of holding the machine, and the test fails."""

from __future__ import annotations

import pytest
import yaml

from gpujob.inventory.hosts import load_inventory
from gpujob.spec.model import load_spec
from helpers import REPO, cli, local_env
from limits import run_limited

SPEC = """\
name: x
target: box
workdir: /root/w
sync:
  - {src: code, dest: code}
gpus: {all: [0, 1]}
env:
  HF_HOME: /root/hf
profiles:
  - {name: a, index_url: 'https://x', packages: [torch==1]}
train:
  command: python t.py
  grace: 30s
throughput: {format: ktok, min: 10K, window: 5}
"""


def spec_error(tmp_path, text: str | bytes, loader=load_spec) -> str:
    path = tmp_path / "job.yaml"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    out = run_limited(loader, str(path), cpu_s=2, extra_mb=200)
    assert out.kind == "error", (out.kind, out.message[-1500:])
    assert "\n" not in out.message, out.message
    assert out.message.startswith(f"{path}:"), out.message
    return out.message.replace(str(path), "job.yaml")


def edit(old: str, new: str) -> str:
    assert old in SPEC
    return SPEC.replace(old, new)


BOMB = "name: x\na: &a [x,x,x,x,x,x,x,x,x]\nb: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]\n" \
       "c: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]\nd: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]\n" \
       "e: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d]\nf: &f [*e,*e,*e,*e,*e,*e,*e,*e,*e]\n" \
       "g: &g [*f,*f,*f,*f,*f,*f,*f,*f,*f]\nh: &h [*g,*g,*g,*g,*g,*g,*g,*g,*g]\n" \
       "i: &i [*h,*h,*h,*h,*h,*h,*h,*h,*h]\n"


@pytest.mark.parametrize("text, expect", [
    ("name: x\nenv: &r [*r]\n", "job.yaml:2: alias *r refers to a value that contains it"),
    ("name: x\nenv: &m {<<: *m}\n", "job.yaml:2: alias *m refers to a value that contains it"),
    ("name: x\nenv: " + "[" * 600 + "]" * 600 + "\n", "job.yaml:2: nested deeper than 40 levels"),
    ("name: x\nenv:\n  A: b\x00c\n", "job.yaml:3: a NUL byte; expected UTF-8 text"),
    ("name: x\nworkdir: !!float 'x'\n", "job.yaml:2: workdir: cannot read the float value 'x'"),
    (edit("grace: 30s", "grace: " + "9" * 400),
     "job.yaml:13: train.grace: expected a duration of at most 365 days"),
    (BOMB, "once aliases are expanded"),
    ("name: x\nenv: {" + ",".join(f"{i:x}: 1" for i in range(100_000)) + "}\n",
     "a mapping with over 2000 keys"),
    ("", "job.yaml:1: empty file"),
    (edit("grace: 30s", "grace: 1.0e+308"),
     "job.yaml:13: train.grace: expected a duration of at most 365 days"),
    (edit("window: 5", "window: " + str(10**30)),
     "job.yaml:14: throughput.window: expected a count from 1 to 10000, got 1000000000000000000000000000000"),
    (edit("all: [0, 1]", "all: [0, " + str(10**30) + "]"),
     "job.yaml:6: gpus.all[1]: expected a GPU index (an integer from 0 to 1023)"),
    (edit("dest: code", "dest: ../../../../tmp/x"),
     "job.yaml:5: sync[0].dest: '../../../../tmp/x' resolves to /tmp/x, outside the workdir"),
    (edit("dest: code", "dest: /"), "job.yaml:5: sync[0].dest: '/' is the container's root"),
    (edit("command: python t.py", "command: cd '{workdir}' && python t.py"),
     "job.yaml:12: train.command: drop the quotes around {workdir}"),
    (edit("command: python t.py", 'command: python t.py --out "{workdir}/o"'),
     "drop the quotes around {workdir}"),
    (edit("command: python t.py", "command: [sh, -c, \"cd '{gpu}'\"]"), "drop the quotes around {gpu}"),
])
def test_each_listed_case_is_one_line(tmp_path, text, expect):
    assert expect in spec_error(tmp_path, text)


def test_utf16_and_non_utf8_have_a_line(tmp_path):
    assert spec_error(tmp_path, SPEC.encode("utf-16")) == \
        "job.yaml:1: not UTF-8 (it looks like UTF-16); save the file as UTF-8"
    assert spec_error(tmp_path, SPEC.encode().replace(b"/root/hf", b"/root/\xe9")).startswith(
        "job.yaml:8: not UTF-8 (byte 0xe9)")


def test_newlines_in_keys_and_names_stay_on_one_line(tmp_path):
    msg = spec_error(tmp_path, edit("HF_HOME: /root/hf", '"HF\\nHOME": /root/hf'))
    assert msg.startswith("job.yaml:8: env['HF\\nHOME']: expected a name matching")
    msg = spec_error(tmp_path, edit("name: a,", 'name: "a\\nb: [/bold]",'))
    assert (msg.startswith("job.yaml:10: profiles[0].name: expected a name matching")
            and "'a\\nb: [/bold]'" in msg)


def test_a_megabyte_value_is_not_echoed_whole(tmp_path):
    msg = spec_error(tmp_path, edit("grace: 30s", "grace: 30s\n  x: '" + "y" * 60_000 + "'"))
    assert "unknown field" in msg and len(msg) < 200
    msg = spec_error(tmp_path, edit("name: x", "name: '" + "x" * 60_000 + "'"))
    assert len(msg) < 300 and "(60000 chars)" in msg


@pytest.mark.parametrize("env_text", ["env: 'HF_TOKEN=sekret-123'", "env: [HF_TOKEN=sekret-123]",
                                      "env: {HF_TOKEN: {value: sekret-123}}",
                                      "env: {HF_TOKEN: [sekret-123]}", "env: {HF_TOKEN: !!float sekret-123}"])
def test_env_values_are_never_echoed(tmp_path, env_text):
    text = SPEC.replace("env:\n  HF_HOME: /root/hf", env_text)
    assert "sekret" not in spec_error(tmp_path, text)
    profile = SPEC.replace("packages: [torch==1]}", "packages: [torch==1], " + env_text.replace(": ", ": ", 1)
                           .replace("env: ", "env: ") + "}")
    assert "sekret" not in spec_error(tmp_path, profile)


def test_secret_references_validate(tmp_path):
    ok = tmp_path / "ok.yaml"
    ok.write_text(edit("HF_HOME: /root/hf", "HF_TOKEN: {from_env: HF_TOKEN}\n  K: {from_file: ~/.tok}"))
    spec = load_spec(ok)
    assert spec.env["HF_TOKEN"].from_env == "HF_TOKEN"
    assert "from_env or from_file" in spec_error(tmp_path, edit("HF_HOME: /root/hf", "T: {from_envv: X}"))
    assert "variable name" in spec_error(tmp_path, edit("HF_HOME: /root/hf", "T: {from_env: 'a b'}"))


def test_inventory_bounds(tmp_path):
    base = "hosts:\n  pve:\n    address: h\n    connect_timeout: 5\n    containers:\n      ct: {vmid: 200}\n"
    assert "hosts.pve.connect_timeout: must be <= 3600" in spec_error(
        tmp_path, base.replace("connect_timeout: 5", "connect_timeout: 1.0e+300"), load_inventory)
    assert "gpus: must be <= 1024" in spec_error(
        tmp_path, base.replace("{vmid: 200}", "{vmid: 200, gpus: 100000000000000000000}"), load_inventory)
    assert "nested deeper" in spec_error(tmp_path, base + "x: " + "[" * 300 + "]" * 300 + "\n",
                                         load_inventory)


def test_cli_line_100_is_not_an_emoji_and_a_missing_target_has_a_line(tmp_path):
    env = local_env(tmp_path)
    spec = tmp_path / "job.yaml"
    spec.write_text("\n" * 99 + "name: [x]\n")
    p = cli(["submit", str(spec), "--plan"], env)
    assert p.returncode == 2 and f"{spec}:100: name: expected a string" in p.stderr.decode()
    assert "💯" not in p.stderr.decode()
    spec.write_text(SPEC.replace("target: box\n", ""))
    p = cli(["submit", str(spec), "--plan"], env)
    assert p.returncode == 2 and p.stderr.decode().startswith(f"gpujob: {spec}:1: target: missing (required)")
    spec.write_text(SPEC.replace("target: box", "target: bx"))
    p = cli(["submit", str(spec), "--plan"], env)
    assert p.returncode == 2 and p.stderr.decode().startswith(f"gpujob: {spec}:2: target: unknown target "
                                                              f"'bx'")


def test_hosts_check_validates_without_connecting(tmp_path):
    env = local_env(tmp_path)
    good = tmp_path / "inv.yaml"
    good.write_text("hosts:\n  pve:\n    address: 192.0.2.1\n    containers:\n      ct: {vmid: 200}\n")
    p = cli(["--hosts", str(good), "hosts", "--check"], env, timeout=30)
    assert p.returncode == 0 and "ok (1 hosts, 1 containers)" in p.stdout.decode()
    good.write_text(good.read_text().replace("200}", "200, gpus: x}"))
    p = cli(["--hosts", str(good), "hosts", "--check"], env, timeout=30)
    assert p.returncode == 2 and f"{good}:5: hosts.pve.containers.ct.gpus:" in p.stderr.decode()


def test_shipped_specs_still_load():
    for name in ("demo", "dflash"):
        assert load_spec(REPO / "jobs" / f"{name}.yaml").name == name
    yaml.safe_load((REPO / "jobs" / "demo.yaml").read_text())
