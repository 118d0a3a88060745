"""gpujob reads the user's ssh config as OpenSSH does (issue 35, row 4): ``ssh -G`` where
ssh is installed, paramiko with ``Include`` followed where it is not; both checked against
what ``ssh -G`` itself answers, in a fresh home (tests/sshgkit.py)."""

from __future__ import annotations

import json
import re
import sys

import pytest

from sshgkit import expected, in_home, settings, write

#: Include relative to ~/.ssh, a glob (sorted), one nested in a Host block and one more
#: below it; Host patterns with a negation and Match lines, all in included files
FILES = {
    "config": "Include conf.d/*.conf\n"
              "Host lab\n"
              "    Include lab-extra.conf\n"
              "Host *\n"
              "    ServerAliveInterval 5\n",
    "conf.d/10-lab.conf": "Host lab\n"
                          "    HostName 10.0.0.5\n"
                          "    Include deeper/port.conf\n"
                          "Host *.lab !bad.lab\n"
                          "    HostName 10.9.9.9\n"
                          "    User pattern\n"
                          "Match originalhost m-*\n"
                          "    Port 2201\n"
                          "    ProxyJump jumper@10.1.1.1:2022\n",
    "conf.d/20-user.conf": "Host lab\n"
                           "    User labuser\n"
                           "    Port 9999\n",
    "conf.d/skipped.txt": "Host lab\n    User never\n",
    "deeper/port.conf": "Port 2222\n"
                        "Host other\n"          # inside lab's block: never for `other`
                        "    User other\n",
    "lab-extra.conf": "IdentityFile ~/.ssh/lab_key\n"
                      "IdentityFile %d/.ssh/%h.key\n"
                      "IdentitiesOnly yes\n",
}
ALIASES = ("lab", "x.lab", "bad.lab", "m-1", "other")


@pytest.fixture
def home(tmp_path):
    h = tmp_path / "home"
    write(h, FILES)
    return h


def _check(home, got: dict) -> None:
    for alias in ALIASES:
        mine = {k: got[alias].get(k) for k in ("hostname", "port", "user", "identity_files",
                                                "proxy_jump", "identities_only")}
        want = expected(home, alias)
        for d in (mine, want):  # ssh -G writes a jump host in brackets, paramiko as written
            d["proxy_jump"] = d["proxy_jump"] and re.sub(r"\[([^\]]+)\]", r"\1", d["proxy_jump"])
        assert mine == want, alias
    # the figures themselves, so that a change of OpenSSH's reading shows here too
    assert (got["lab"]["hostname"], got["lab"]["port"], got["lab"]["user"]) == ("10.0.0.5", 2222, "labuser")
    assert got["lab"]["identities_only"] is True and len(got["lab"]["identity_files"]) == 2
    assert got["lab"]["identity_files"][1].endswith("/.ssh/10.0.0.5.key")
    assert (got["x.lab"]["hostname"], got["x.lab"]["user"]) == ("10.9.9.9", "pattern")
    assert got["bad.lab"]["hostname"] == "bad.lab" and got["m-1"]["port"] == 2201
    assert got["m-1"]["proxy_jump"] in ("jumper@10.1.1.1:2022", "jumper@[10.1.1.1]:2022")  # ssh -G: [...]
    assert got["m-1"]["jump"] == ["jumper", "10.1.1.1", 2022] and got["other"]["user"] != "other"


def test_ssh_g_decides_where_ssh_is_installed(home):
    _check(home, settings(home, *ALIASES))


def test_without_ssh_paramiko_follows_include_the_same_way(home, tmp_path):
    nossh = tmp_path / "nossh"
    nossh.mkdir()
    _check(home, settings(home, *ALIASES, path=str(nossh)))


@pytest.mark.parametrize("with_ssh", [True, False])
def test_an_include_loop_is_one_line_not_a_hang(tmp_path, with_ssh):
    home = tmp_path / "home"
    write(home, {"config": "Include loop.conf\n", "loop.conf": "Host lab\n  Include loop.conf\n"})
    nossh = tmp_path / "nossh"
    nossh.mkdir()
    got = settings(home, "lab", path=None if with_ssh else str(nossh))["lab"]
    assert "error" in got, got
    said = got["error"]
    assert "\n" not in said
    assert ("Too many recursive configuration includes" in said if with_ssh
            else "nested more than 16 levels" in said), said


def test_a_config_ssh_refuses_is_one_line_naming_file_and_line(tmp_path):
    home = tmp_path / "home"
    write(home, {"config": "Include bad.conf\n", "bad.conf": "Host lab\n  HostName 10.0.0.5\n  Bogus yes\n"})
    said = settings(home, "lab")["lab"].get("error", "")
    assert "bad.conf" in said and "line 3" in said and "ogus" in said and "\n" not in said, said


COUNT = r"""
import sys
from gpujob.inventory.hosts import Container, Host
from gpujob.transport.ssh_config import ssh_settings
def look(a):
    return ssh_settings("h", Host(address=a, containers={"c": Container(vmid=200)})).hostname
print(look("lab"), look("lab"), look("x.lab"), look("lab"))
import os, time
inc = os.path.expanduser("~/.ssh/conf.d/10-lab.conf")
text = open(inc).read().replace("10.0.0.5", "10.0.0.6")
open(inc, "w").write(text)
os.utime(inc, ns=(time.time_ns() + 10**9,) * 2)
print(look("lab"), look("lab"))
"""


def test_ssh_g_runs_once_per_host_per_process_until_an_included_file_changes(home, tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "ssh.log"
    wrapper = bin_dir / "ssh"
    wrapper.write_text(f'#!/bin/sh\necho "$*" >> {log}\nexec /usr/bin/ssh "$@"\n')
    wrapper.chmod(0o755)
    p = in_home(home, [sys.executable, "-c", COUNT], path=f"{bin_dir}:/usr/bin:/bin")
    assert p.returncode == 0, p.stderr.decode()
    assert p.stdout.decode().split() == ["10.0.0.5"] * 2 + ["10.9.9.9", "10.0.0.5"] + ["10.0.0.6"] * 2
    runs = log.read_text().splitlines() if log.exists() else []
    assert [r.split()[-1] for r in runs] == ["lab", "x.lab", "lab"], runs
    assert all(r.startswith("-G ") for r in runs), runs


def test_directives_gpujob_cannot_honour_are_named_one_line_each(tmp_path):
    home = tmp_path / "home"
    write(home, {"config": "Include odd.conf\n",
                 "odd.conf": "Host odd\n  HostName 10.0.0.7\n  ProxyCommand nc %h %p\n"
                             "  CertificateFile ~/.ssh/other-cert.pub\n  StrictHostKeyChecking no\n"
                             "  HostKeyAlias box\n"
                             "Host plain\n  HostName 10.0.0.8\n"})
    got = settings(home, "odd", "plain")
    notes = got["odd"]["notes"]
    assert notes is not None and len(notes) == 4, notes
    for word in ("ProxyCommand", "CertificateFile", "StrictHostKeyChecking no", "HostKeyAlias"):
        assert sum(word in n for n in notes) == 1, (word, notes)
    assert all("host 'odd'" in n and "\n" not in n for n in notes)
    assert got["plain"]["notes"] == []


WATCHED = r"""
import sys
from gpujob.daemon.pool import Entry
print("\n".join(str(p) for p in Entry(sys.argv[1], "x").watched))
"""


def test_the_daemon_watches_every_included_file_and_glob_folder(home, tmp_path):
    inv = tmp_path / "hosts.yaml"
    inv.write_text(json.dumps({"hosts": {"h": {"address": "lab", "containers": {"c": {"vmid": 200}}}}}))
    p = in_home(home, [sys.executable, "-c", WATCHED, str(inv)])
    assert p.returncode == 0, p.stderr.decode()
    watched = {w.replace(str(home), "~").replace(pwd_home(), "~") for w in p.stdout.decode().split()}
    for name in ("config", "conf.d/10-lab.conf", "conf.d/20-user.conf", "conf.d",
                 "lab-extra.conf", "deeper/port.conf"):
        assert f"~/.ssh/{name}" in watched, (name, watched)
    assert "~/.ssh/conf.d/skipped.txt" not in watched


def pwd_home() -> str:
    from sshgkit import ACCOUNT_HOME
    return ACCOUNT_HOME
