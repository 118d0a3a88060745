"""The inventory cache seen from another process: a gpujob killed (-9) while writing it leaves
nothing a reader believes, and a hit in a fresh interpreter imports neither pydantic nor yaml
(the cache in-process: tests/unit/test_invcache.py)."""

from __future__ import annotations

import os
import subprocess
import sys

from gpujob.inventory import cache as invcache
from gpujob.inventory.hosts import Inventory
from helpers import REPO
from test_invcache import cached_files, hosts, rt  # noqa: F401 (rt: a fixture)


def test_killed_while_writing_the_cache_leaves_nothing_read(tmp_path, rt):
    path = hosts(tmp_path)
    code = (f"import sys; sys.path.insert(0, {str(REPO)!r}); from gpujob.inventory import cache as invcache; "
            f"invcache.load({path!r})")
    env = dict(os.environ, GPUJOB_TEST_DIE_AT=f"invcache_written@{tmp_path / 'died'}")
    p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, timeout=60)
    assert p.returncode == -9 and (tmp_path / "died").exists()
    assert not cached_files(rt) and len(list(rt.glob(".inv-*.tmp"))) == 1
    assert isinstance(invcache.load(path), Inventory) and isinstance(invcache.load(path), invcache.View)


def test_a_hit_imports_neither_pydantic_nor_yaml(tmp_path, rt):
    path = hosts(tmp_path)
    invcache.load(path)
    code = (f"import sys; sys.path.insert(0, {str(REPO)!r}); from gpujob.inventory import cache as invcache; "
            f"i = invcache.load({path!r}); print(type(i).__name__, i.resolve('ct200')[3].vmid); "
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'pydantic', 'yaml', 'pydantic_core'}))")
    p = subprocess.run([sys.executable, "-c", code], env=dict(os.environ), capture_output=True, timeout=60)
    assert p.stdout.decode().splitlines() == ["View 200", "[]"], p.stderr
