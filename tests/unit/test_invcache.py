"""The cold exec's cache of the validated inventory (gpujob/inventory/cache.py): a hit only for
the very bytes validated before by this gpujob, the same attributes as the model, every
check still made on an edited file, and a cache file that is not what we wrote (not
private, a planted link, another key, torn by a kill) believed never."""

from __future__ import annotations

import json
import os
import textwrap
from pathlib import Path

import pytest

from gpujob.inventory import cache as invcache
from gpujob.conn import paths
from gpujob.errors import InputError, SpecError
from gpujob.inventory.hosts import Container, Host, Inventory, load_inventory

GOOD = """\
hosts:
  pve1:
    address: 10.1.2.6
    port: 2222
    user: root
    identity_file: ~/.ssh/id_ed25519
    known_hosts: ~/.ssh/known_hosts
    proxy_jump: bastion
    pct: /usr/sbin/pct
    connect_timeout: 4.5
    keepalive: 0
    env_passthrough: [HF_*, WANDB_API_KEY]
    containers:
      ct200: {vmid: 200, gpus: 8, address: 10.0.0.5, env_passthrough: [NCCL_*]}
      ct201: {vmid: 201, home: "/opt/gpujob ✓"}
  pve2:
    address: pve2.lan
    containers:
      ct201: {vmid: 301}
  laptop:
    kind: local
    containers:
      demo: {root: ~/.local/share/gpujob/demo}
"""


@pytest.fixture
def rt(tmp_path, monkeypatch):
    d = tmp_path / "run"
    d.mkdir(mode=0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(d))
    return d / "gpujob"


def hosts(tmp_path, text=GOOD) -> str:
    p = tmp_path / "hosts.yaml"
    p.write_text(textwrap.dedent(text))
    return str(p)


def cached_files(rt: Path) -> list[Path]:
    return sorted(rt.glob("inv-*.json"))


def test_a_hit_has_every_field_of_the_model_with_the_same_values(tmp_path, rt):
    path = hosts(tmp_path)
    first = invcache.load(path)
    assert isinstance(first, Inventory)  # a miss: validated by the model, then cached
    assert len(cached_files(rt)) == 1 and cached_files(rt)[0].stat().st_mode & 0o777 == 0o600
    hit = invcache.load(path)
    assert isinstance(hit, invcache.View)
    model = load_inventory(Path(path))
    assert hit.source == model.source == path and hit.targets() == model.targets()
    assert set(hit.hosts) == set(model.hosts)
    for name, host in model.hosts.items():
        for field in Host.model_fields:
            if field != "containers":
                got, want = getattr(hit.hosts[name], field), getattr(host, field)
                assert (got, type(got)) == (want, type(want)), (name, field)
        assert set(hit.hosts[name].containers) == set(host.containers)
        for cname, c in host.containers.items():
            for field in Container.model_fields:
                got, want = getattr(hit.hosts[name].containers[cname], field), getattr(c, field)
                assert (got, type(got)) == (want, type(want)), (name, cname, field)
    for target in ("ct200", "pve2/ct201", "demo"):
        h, host, c, cont = hit.resolve(target)
        assert (h, c) == model.resolve(target)[::2] and cont.vmid == model.resolve(target)[3].vmid
    for target in ("ct201", "ct9"):  # on two hosts; unknown: the model's own words
        with pytest.raises(InputError) as a:
            hit.resolve(target)
        with pytest.raises(InputError) as b:
            model.resolve(target)
        assert a.value.message == b.value.message


@pytest.mark.parametrize("bad, said", [
    ('      ct201: {vmid: 201, home: "/root/x\\ntouch /tmp/P #"}', "control character"),
    ("      ct201: {vmid: 201, gpus: -1}", "must be >= 0"),
    ("      ct201: {vmid: 201, hme: /x}", "unknown field"),
    ("      ct201: {vmid: 201, root: /x}", "only for local hosts"),
])
def test_an_edited_file_is_validated_afresh_every_check_holds(tmp_path, rt, bad, said):
    path = hosts(tmp_path)
    invcache.load(path)
    assert isinstance(invcache.load(path), invcache.View)
    st = os.stat(path)
    text = GOOD.replace('      ct201: {vmid: 201, home: "/opt/gpujob ✓"}', bad)
    Path(path).write_text(text)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))  # the same mtime: the bytes decide
    with pytest.raises(SpecError) as e:
        invcache.load(path)
    assert said in str(e.value)
    with pytest.raises(SpecError):  # and again: nothing of the refused file was cached
        invcache.load(path)


def test_another_gpujob_validates_afresh(tmp_path, rt, monkeypatch):
    path = hosts(tmp_path)
    invcache.load(path)
    monkeypatch.setattr(paths, "code_stamp", lambda pkg=None: "another gpujob")
    assert isinstance(invcache.load(path), Inventory)
    assert isinstance(invcache.load(path), invcache.View)


def test_a_cache_file_not_as_we_write_it_is_never_believed(tmp_path, rt):
    path = hosts(tmp_path)
    invcache.load(path)
    [cache] = cached_files(rt)
    # readable by others: not ours to trust
    cache.chmod(0o644)
    assert isinstance(invcache.load(path), Inventory)
    assert cache.stat().st_mode & 0o777 == 0o600  # written afresh
    # another key (other bytes' validation) in it
    data = json.loads(cache.read_text())
    data["key"] = "0" * 64
    cache.write_text(json.dumps(data))
    assert isinstance(invcache.load(path), Inventory)
    # a planted link: not followed, neither read nor written through
    other = tmp_path / "elsewhere.json"
    other.write_text(cache.read_text())
    other.chmod(0o600)
    cache.unlink()
    cache.symlink_to(other)
    before = other.read_bytes()
    assert isinstance(invcache.load(path), Inventory)
    assert not cache.is_symlink() and other.read_bytes() == before
    # torn, or not the shape written
    for junk in ("{", '{"version": 1, "key": "%s", "inventory": {"hosts": {"h": 1}}}' % data["key"]):
        cache.write_text(junk)
        assert isinstance(invcache.load(path), Inventory)
    assert isinstance(invcache.load(path), invcache.View)


def test_a_runtime_dir_not_private_means_no_cache(tmp_path, rt):
    rt.mkdir(mode=0o700)
    rt.chmod(0o755)  # not private: paths.runtime_dir refuses it, as the daemon does
    path = hosts(tmp_path)
    assert isinstance(invcache.load(path), Inventory)
    assert isinstance(invcache.load(path), Inventory) and not list(tmp_path.rglob("inv-*.json"))


