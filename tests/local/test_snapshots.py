"""Compile-cache snapshots (gpujob/agent/home/snapshots.py): hard links for inductor and
triton, copies for torch_extensions, keep N, restore by temp dir + rename, and a
process killed at any moment of a snapshot or a restore leaves the old cache or the
whole new one."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from gpujob.agent.home import snapshots
from gpujob.agent.base import envs

REPO = Path(__file__).resolve().parents[2]


def fill(home: Path, key: str, tag: str, n: int = 40) -> None:
    base = Path(envs.cache_dir(str(home), key))
    for sub in ("inductor", "triton", "torch_extensions"):
        for i in range(n):
            p = base / sub / f"d{i % 7}" / f"k{i}.bin"
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text(f"{tag} {sub} {i}\n" * 50)
    envs.mark_warm(str(home), key, "h1", profile="p")


def digest(path: Path) -> str:
    """One hash of a tree's relative paths and contents (the warm marker and the
    restore note aside)."""
    h = hashlib.sha256()
    for p in sorted(path.rglob("*")):
        if p.is_file() and p.name not in (".gpujob-restored", "meta.json"):
            h.update(str(p.relative_to(path)).encode() + b"\0" + p.read_bytes())
    return h.hexdigest()


def test_snapshot_links_inductor_and_triton_copies_extensions_and_keeps_n(tmp_path):
    home, key = tmp_path, "fast-abc"
    fill(home, key, "v1")
    live = Path(envs.cache_dir(str(home), key))
    meta = snapshots.take(str(home), key, keep=1, profile="fast", env_key=key)
    assert meta["files"] == 120 and meta["linked"] == 80 and meta["warm"]
    snap = Path(meta["path"])
    assert os.stat(snap / "inductor/d0/k0.bin").st_ino == os.stat(live / "inductor/d0/k0.bin").st_ino
    assert os.stat(snap / "torch_extensions/d0/k0.bin").st_ino != \
        os.stat(live / "torch_extensions/d0/k0.bin").st_ino
    assert digest(snap) == digest(live)
    assert (snap / "meta.json").exists()
    # an in-place rebuild of torch_extensions does not reach the snapshot
    (live / "torch_extensions/d0/k0.bin").write_text("rebuilt")
    assert (snap / "torch_extensions/d0/k0.bin").read_text().startswith("v1")
    time.sleep(0.01)
    second = snapshots.take(str(home), key, keep=1, profile="fast", env_key=key)
    assert [m["name"] for m in snapshots.listing(str(home), key)] == [second["name"]]
    third = snapshots.take(str(home), key, keep=2, profile="fast", env_key=key)
    assert [m["name"] for m in snapshots.listing(str(home), key)] == [third["name"], second["name"]]
    assert snapshots.describe(third).endswith(f"({third['files']} files, {third['bytes'] / 1e6:.1f} MB)")


def test_restore_brings_back_the_cache_and_its_warm_marker(tmp_path):
    home, key = tmp_path, "fast-abc"
    fill(home, key, "v1")
    live = Path(envs.cache_dir(str(home), key))
    before = digest(live)
    snapshots.take(str(home), key, keep=1)
    envs.remove_tree(str(live))  # `gpujob cache clear`
    assert snapshots.cache_files(str(home), key) == 0
    meta = snapshots.restore(str(home), key)
    assert meta["restored"]["files"] == 120
    assert digest(live) == before
    assert envs.warm_state(str(home), key, "h1") == "warm"
    assert not [n for n in os.listdir(home / "caches") if n.startswith(".")]
    assert snapshots.restore(str(home), "other-key") is None


def test_restore_due_and_proof_are_pure_rules():
    snap = {"name": "s"}
    due = snapshots.restore_due
    assert due(cold_start=False, known_good=True, live_empty=True, snapshot=snap)
    assert due(cold_start=True, known_good=True, live_empty=True, snapshot=snap) is None
    assert due(cold_start=False, known_good=False, live_empty=True, snapshot=snap) is None
    assert due(cold_start=False, known_good=True, live_empty=False, snapshot=snap) is None
    assert due(cold_start=False, known_good=True, live_empty=True, snapshot=None) is None
    assert snapshots.proof_of("cold", None, "k") == "cold"
    assert snapshots.proof_of("warm", None, "k") == "warm"
    assert snapshots.proof_of("restored", None, "k") == "warm"
    assert snapshots.proof_of("warm", {"proof": "cold", "env_key": "k"}, "k") == "cold"
    assert snapshots.proof_of("warm", {"proof": "cold", "env_key": "old"}, "k") == "warm"


# ---- a process killed mid-snapshot or mid-restore ----------------------------

WORKER = textwrap.dedent("""
    import os, signal, sys
    sys.path.insert(0, sys.argv[1])
    from gpujob.agent.home import snapshots
    home, key, what, die = sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5]
    if die == "between-renames":  # the worst moment of a swap: the live cache moved aside
        real = os.rename
        def rename(a, b):
            real(a, b)
            if "/.old-" in b:
                os.kill(os.getpid(), signal.SIGKILL)
        os.rename = rename
    print("go", flush=True)
    if what == "take":
        snapshots.take(home, key, keep=1)
    else:
        snapshots.restore(home, key)
    print("done", flush=True)
""")


def worker(tmp_path, key, what, die="") -> subprocess.Popen:
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    return subprocess.Popen([sys.executable, str(script), str(REPO), str(tmp_path / "home"), key, what, die],
                            stdout=subprocess.PIPE)


def test_a_restore_killed_between_its_renames_leaves_the_old_cache(tmp_path):
    home, key = tmp_path / "home", "fast-abc"
    fill(home, key, "snap")
    snapshots.take(str(home), key)
    live = Path(envs.cache_dir(str(home), key))
    envs.remove_tree(str(live))
    fill(home, key, "live", n=5)  # a different (failed cold) cache in place
    old = digest(live)
    p = worker(tmp_path, key, "restore", "between-renames")
    p.wait(30)
    assert p.returncode == -signal.SIGKILL
    assert not live.exists()  # cut between the renames...
    assert snapshots.recover(str(home), key)  # ...and put back by whoever looks next
    assert digest(live) == old
    assert snapshots.restore(str(home), key)["restored"]["files"] == 120  # and it can be done again


def test_kill_at_any_moment_leaves_old_or_whole_new(tmp_path):
    """SIGKILL a snapshot and a restore of 1200 files after increasing delays: after
    recover, the live cache is the old one or the whole snapshot, and the snapshots
    are the old list or the old list plus one whole new one."""
    home, key, tkey = tmp_path / "home", "fast-abc", "slow-def"
    fill(home, key, "snap", n=400)
    fill(home, tkey, "take", n=400)
    snapshots.take(str(home), key, keep=5)
    live = Path(envs.cache_dir(str(home), key))
    want_new = digest(live)
    outcomes = {"take": set(), "restore": set()}
    for i, delay in enumerate([0.0, 0.02, 0.05, 0.08, 0.12, 0.2, 0.3, 0.5, 1.5]):
        # restore over a small other cache
        envs.remove_tree(str(live))
        fill(home, key, f"old{i}", n=3)
        old = digest(live)
        p = worker(tmp_path, key, "restore")
        p.stdout.readline()
        time.sleep(delay)
        p.send_signal(signal.SIGKILL)
        p.wait(30)
        snapshots.recover(str(home), key)
        got = digest(live)
        assert got in (old, want_new), f"restore killed after {delay}s left a mixed cache"
        outcomes["restore"].add("new" if got == want_new else "old")
        # a snapshot killed midway: none new, or one whole new one
        before = [m["name"] for m in snapshots.listing(str(home), tkey)]
        p = worker(tmp_path, tkey, "take")
        p.stdout.readline()
        time.sleep(delay)
        p.send_signal(signal.SIGKILL)
        p.wait(30)
        snapshots.recover(str(home), tkey)
        after = snapshots.listing(str(home), tkey)
        names = [m["name"] for m in after]
        # keep=1: the old list, or the new one (its predecessor pruned, or not yet when killed)
        assert names == before or (names[0] not in before and names[1:] in (before, [])), (before, names)
        for m in after:  # every snapshot that counts is whole: its files match its meta
            stats = snapshots.tree_stats(m["path"])
            assert stats["files"] == m["files"] + 2, (m["name"], stats, m["files"])  # + meta, marker
        outcomes["take"].add("new" if set(names) - set(before) else "old")
        root = Path(snapshots.snap_root(str(home), tkey))
        assert not root.exists() or not [n for n in os.listdir(root) if n.startswith(".")]
        assert not [n for n in os.listdir(home / "caches") if n.startswith(".")]
    # the kills did land on both sides of the commit point at least once each
    assert outcomes == {"restore": {"old", "new"}, "take": {"old", "new"}}, outcomes


def test_prove_cold_refusal_and_profile_matching_are_pure_rules():
    from gpujob.agent.verbs import cachecmd
    in_use = {"job-a": [0, 1], "job-b": [2, 3]}
    assert cachecmd.refusal([4, 5], in_use) is None
    assert cachecmd.refusal([1, 4], in_use) == "job job-a runs on GPUs 1; pick others with --gpus"
    assert cachecmd.refusal([3, 2], {}) is None
    keys = ["fast-1186b1b8728d", "fast2-aaaaaaaaaaaa", "slow-0123456789ab"]
    assert cachecmd.matching(keys, "fast") == ["fast-1186b1b8728d"]
    assert cachecmd.matching(keys, "slow-0123456789ab") == ["slow-0123456789ab"]
    assert cachecmd.matching(keys, None) == keys
