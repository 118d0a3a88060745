import textwrap
from pathlib import Path

import pytest

from gpujob.errors import InputError, SpecError
from gpujob.inventory.hosts import Container, Host, find_inventory, load_inventory
from gpujob.transport.ssh_config import ssh_settings

GOOD = """\
hosts:
  pve1:
    address: 10.1.2.6
    port: 22
    user: root
    identity_file: ~/.ssh/id_ed25519
    known_hosts: ~/.ssh/known_hosts
    proxy_jump: bastion
    pct: /usr/sbin/pct
    containers:
      ct200: {vmid: 200, gpus: 8}
      ct201: {vmid: 201, home: /opt/gpujob}
  laptop:
    kind: local
    containers:
      demo: {root: ~/.local/share/gpujob/demo}
"""


def write(tmp_path, text, name="hosts.yaml"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def error(tmp_path, text):
    path = write(tmp_path, text)
    with pytest.raises(SpecError) as info:
        load_inventory(path)
    return str(info.value).replace(str(path), "hosts.yaml")


def test_good_inventory(tmp_path):
    path = write(tmp_path, GOOD)
    inventory = load_inventory(path)
    assert inventory.source == str(path)
    assert inventory.targets() == [("pve1", "ct200"), ("pve1", "ct201"), ("laptop", "demo")]
    pve1 = inventory.hosts["pve1"]
    assert (pve1.kind, pve1.address, pve1.port, pve1.pct, pve1.connect_timeout, pve1.keepalive) == \
        ("ssh", "10.1.2.6", 22, "/usr/sbin/pct", 10, 15)
    assert pve1.containers["ct200"].gpus == 8 and pve1.containers["ct200"].home is None
    assert pve1.containers["ct201"].home == "/opt/gpujob"
    laptop = inventory.hosts["laptop"]
    assert laptop.kind == "local" and laptop.containers["demo"].root == "~/.local/share/gpujob/demo"


def test_embedded_default():
    inventory = load_inventory(None)
    assert inventory.source == "embedded default"
    host_name, host, name, container = inventory.resolve("demo")
    assert (host_name, host.kind, name, container.root) == ("local", "local", "demo",
                                                            "~/.local/share/gpujob/demo")


def test_resolve(tmp_path):
    inventory = load_inventory(write(tmp_path, GOOD + "  other:\n    address: o\n    containers:\n      "
                                                      "demo: {vmid: 300}\n"))
    host_name, host, name, container = inventory.resolve("ct200")
    assert (host_name, host.address, name, container.vmid) == ("pve1", "10.1.2.6", "ct200", 200)
    assert inventory.resolve("other/demo")[3].vmid == 300
    assert inventory.resolve("laptop/demo")[0] == "laptop"
    with pytest.raises(InputError) as info:
        inventory.resolve("demo")
    assert str(info.value) == "target 'demo' is on several hosts; say laptop/demo or other/demo"
    with pytest.raises(InputError) as info:
        inventory.resolve("ct2000")
    assert str(info.value) == \
        "unknown target 'ct2000'; known: ct200, ct201, laptop/demo, other/demo (did you mean 'ct200'?)"
    with pytest.raises(InputError) as info:
        inventory.resolve("pve1/demo")
    assert str(info.value).startswith("unknown target 'pve1/demo'; known: ")
    with pytest.raises(InputError) as info:
        inventory.resolve("zzz")
    assert str(info.value) == "unknown target 'zzz'; known: ct200, ct201, laptop/demo, other/demo"


def test_unknown_target_message_from_brief(tmp_path):
    inventory = load_inventory(write(tmp_path,
                                     GOOD.replace("      ct201: {vmid: 201, home: /opt/gpujob}\n", "")))
    with pytest.raises(InputError) as info:
        inventory.resolve("ct2000")
    assert str(info.value) == "unknown target 'ct2000'; known: ct200, demo (did you mean 'ct200'?)"


@pytest.mark.parametrize("old, new, message", [
    ("vmid: 200", "vmid: '200'",
     "hosts.yaml:11: hosts.pve1.containers.ct200.vmid: expected an integer VMID, got '200'"),
    ("vmid: 200", "vmid: -5",
     "hosts.yaml:11: hosts.pve1.containers.ct200.vmid: expected a VMID between 100 and 999999999, got -5"),
    ("vmid: 200", "vmid: 200.0",
     "hosts.yaml:11: hosts.pve1.containers.ct200.vmid: expected an integer VMID, got 200.0"),
    ("vmid: 200", "vmid: true",
     "hosts.yaml:11: hosts.pve1.containers.ct200.vmid: expected an integer VMID, got true"),
    ("vmid: 200, ", "", "hosts.yaml:11: hosts.pve1.containers.ct200.vmid: missing (required)"),
    ("gpus: 8", "gpus: -1", "hosts.yaml:11: hosts.pve1.containers.ct200.gpus: must be >= 0, got -1"),
    ("gpus: 8", "gpus: eight",
     "hosts.yaml:11: hosts.pve1.containers.ct200.gpus: expected an integer, got 'eight'"),
    ("gpus: 8}", "gpus: 8, root: /x}",
     "hosts.yaml:11: hosts.pve1.containers.ct200.root: only for local hosts"),
    ("{root: ~/.local/share/gpujob/demo}", "{}",
     "hosts.yaml:16: hosts.laptop.containers.demo.root: missing (required)"),
    ("{root: ", "{vmid: 300, root: ", "hosts.yaml:16: hosts.laptop.containers.demo.vmid: only for ssh hosts"),
    ("{root: ", "{home: /h, root: ", "hosts.yaml:16: hosts.laptop.containers.demo.home: only for ssh hosts"),
    ("    address: 10.1.2.6\n", "", "hosts.yaml:2: hosts.pve1.address: missing (required)"),
    ("kind: local", "kind: local\n    address: 10.0.0.1",
     "hosts.yaml:15: hosts.laptop.address: only for ssh hosts"),
    ("kind: local", "kind: lxc", "hosts.yaml:14: hosts.laptop.kind: expected one of ssh, local, got 'lxc'"),
    ("address:", "adress:", "hosts.yaml:3: hosts.pve1.adress: unknown field; did you mean 'address'?"),
    ("pct:", "zzz:", "hosts.yaml:9: hosts.pve1.zzz: unknown field"),
    ("port: 22", "port: 70000", "hosts.yaml:4: hosts.pve1.port: must be <= 65535, got 70000"),
    ("port: 22", "port: '22'", "hosts.yaml:4: hosts.pve1.port: expected an integer, got '22'"),
    ("ct200:", "'ct 200':",
     "hosts.yaml:11: hosts.pve1.containers['ct 200']: expected a name matching [A-Za-z0-9][A-Za-z0-9_.-]*, "
     "got 'ct 200'"),
    ("containers:\n      demo: {root: ~/.local/share/gpujob/demo}", "containers: {}",
     "hosts.yaml:15: hosts.laptop.containers: must not be empty"),
    ("ct201: {vmid: 201", "ct200: {vmid: 201", "hosts.yaml:12: hosts.pve1.containers: duplicate key 'ct200'"),
    ("    pct: /usr/sbin/pct\n", "    connect_timeout: soon\n",
     "hosts.yaml:9: hosts.pve1.connect_timeout: expected a number, got 'soon'"),
])
def test_broken(tmp_path, old, new, message):
    assert old in GOOD
    assert error(tmp_path, GOOD.replace(old, new)) == message


@pytest.mark.parametrize("text, message", [
    ("hosts: [a\n",
     "hosts.yaml:2: not valid YAML: while parsing a flow sequence, did not find expected ',' or ']'"),
    ("- pve1\n", "hosts.yaml:1: expected a mapping at the top level, got a list"),
    ("", "hosts.yaml:1: empty file; expected a YAML mapping"),
    ("hosts: {}\n", "hosts.yaml:1: hosts: must not be empty"),
    ("hosts:\n", "hosts.yaml:1: hosts: expected a mapping, got null"),
    ("host:\n  a: {}\n", "hosts.yaml:1: host: unknown field; did you mean 'hosts'?"),
])
def test_broken_whole(tmp_path, text, message):
    assert error(tmp_path, text) == message


@pytest.fixture
def places(tmp_path, monkeypatch):
    """An empty cwd and config dir; returns (cwd, config file path)."""
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    monkeypatch.delenv("GPUJOB_HOSTS", raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    config = tmp_path / "config" / "gpujob" / "hosts.yaml"
    config.parent.mkdir(parents=True)
    return cwd, config


def test_find_inventory_order(tmp_path, places, monkeypatch):
    cwd, config = places
    assert find_inventory(None) is None
    config.write_text(GOOD)
    assert find_inventory(None) == config
    (cwd / "hosts.yaml").write_text(GOOD)  # a clone's example never shadows the user's own (issue 34 row 4)
    assert find_inventory(None) == config
    config.unlink()
    assert find_inventory(None) == Path("hosts.yaml")
    config.write_text(GOOD)
    env = write(tmp_path, GOOD, "env.yaml")
    monkeypatch.setenv("GPUJOB_HOSTS", str(env))
    assert find_inventory(None) == env
    explicit = write(tmp_path, GOOD, "explicit.yaml")
    assert find_inventory(str(explicit)) == explicit


def test_find_inventory_home_config(tmp_path, places, monkeypatch):
    monkeypatch.delenv("XDG_CONFIG_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    config = tmp_path / "home" / ".config" / "gpujob" / "hosts.yaml"
    config.parent.mkdir(parents=True)
    config.write_text(GOOD)
    assert find_inventory(None) == config


def test_find_inventory_missing_is_an_error(tmp_path, places, monkeypatch):
    places[1].write_text(GOOD)  # no fallthrough to it
    with pytest.raises(InputError) as info:
        find_inventory(str(tmp_path / "nope.yaml"))
    assert str(info.value) == f"--hosts: no such file: {tmp_path / 'nope.yaml'}"
    monkeypatch.setenv("GPUJOB_HOSTS", str(tmp_path / "gone.yaml"))
    with pytest.raises(InputError) as info:
        find_inventory(None)
    assert str(info.value) == f"$GPUJOB_HOSTS: no such file: {tmp_path / 'gone.yaml'}"


SSH_CONFIG = """\
Host gpubox
    HostName 10.1.2.6
    User admin
    Port 2222
    IdentityFile ~/.ssh/gpu_key
    ProxyJump bastion

Host bastion
    HostName bastion.example.com
    User jump
    Port 2200
    IdentityFile /keys/jump

Host loop
    ProxyJump loop
"""


def ssh_host(**fields):
    return Host(containers={"ct": Container(vmid=200)}, **fields)


def test_ssh_settings_from_config(tmp_path):
    config = write(tmp_path, SSH_CONFIG, "ssh_config")
    s = ssh_settings("pve1", ssh_host(address="gpubox"), config)
    home = Path.home()
    assert (s.hostname, s.port, s.user, s.identity_files, s.proxy_jump) == \
        ("10.1.2.6", 2222, "admin", [str(home / ".ssh/gpu_key")], "bastion")
    assert s.known_hosts == home / ".ssh/known_hosts"
    assert (s.connect_timeout, s.keepalive) == (10, 15)
    j = s.jump
    assert (j.hostname, j.port, j.user, j.identity_files, j.proxy_jump, j.jump) == \
        ("bastion.example.com", 2200, "jump", ["/keys/jump"], None, None)


def test_ssh_settings_inventory_wins(tmp_path):
    config = write(tmp_path, SSH_CONFIG, "ssh_config")
    host = ssh_host(address="gpubox", user="root", port=22, identity_file="~/k", known_hosts="/kh",
                    proxy_jump="me@jumphost:23", connect_timeout=3, keepalive=0)
    s = ssh_settings("pve1", host, config)
    assert (s.hostname, s.port, s.user, s.identity_files, s.known_hosts) == \
        ("10.1.2.6", 22, "root", [str(Path.home() / "k")], Path("/kh"))
    assert (s.connect_timeout, s.keepalive) == (3, 0)
    assert (s.jump.hostname, s.jump.port, s.jump.user) == ("jumphost", 23, "me")
    via_alias = ssh_settings("pve1", ssh_host(address="10.9.9.9", proxy_jump="bastion"), config)
    assert (via_alias.hostname, via_alias.jump.hostname, via_alias.jump.user) == \
        ("10.9.9.9", "bastion.example.com", "jump")


def test_ssh_settings_defaults_without_config(tmp_path):
    s = ssh_settings("pve1", ssh_host(address="10.0.0.1"), tmp_path / "no_config")
    assert (s.hostname, s.port, s.user, s.identity_files, s.proxy_jump, s.jump) == \
        ("10.0.0.1", 22, "root", [], None, None)


def test_ssh_settings_errors(tmp_path):
    config = write(tmp_path, SSH_CONFIG, "ssh_config")
    # OpenSSH (ssh -G) refuses the loop itself; paramiko's reading gets to gpujob's one level
    with pytest.raises(InputError, match="^(proxy_jump 'loop' of jump host 'loop': only one level of jump"
                                         "|ssh config for host 'loop': jumphost loop via loop)"):
        ssh_settings("pve1", ssh_host(address="x", proxy_jump="loop"), config)
    with pytest.raises(InputError,
                       match=r"^proxy_jump 'a,b': expected one jump host, \[user@\]host\[:port\]$"):
        ssh_settings("pve1", ssh_host(address="x", proxy_jump="a,b"), config)
    local = load_inventory(None).hosts["local"]
    with pytest.raises(InputError, match="^host 'local' is local; it has no SSH settings$"):
        ssh_settings("local", local, config)


def test_jump_host_without_a_key_of_its_own_tries_the_hosts_key(tmp_path):
    config = write(tmp_path, SSH_CONFIG, "ssh_config")
    s = ssh_settings("pve1", ssh_host(address="10.9.9.9", identity_file="~/k", proxy_jump="root@10.0.0.9"),
                     config)
    assert s.jump.identity_files == [str(Path.home() / "k")]
    s = ssh_settings("pve1", ssh_host(address="10.9.9.9", identity_file="~/k", proxy_jump="bastion"), config)
    assert s.jump.identity_files == ["/keys/jump"]  # the jump's own config entry wins
