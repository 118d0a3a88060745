"""The house rule: no module over 450 lines (split rather than grow). Held on every source
file of the house: the package, the bench, the test bed, the scripts, the example jobs, and
the tests themselves."""

from __future__ import annotations

from pathlib import Path

from helpers import REPO

LIMIT = 450
#: where the rule holds: every .py below these, and every file of scripts/ (bash or python)
TREES = ("gpujob", "bench", "testbed", "jobs", "tests")
SCRIPTS = "scripts"


def _lines(path: Path) -> int:
    return len(path.read_text(encoding="utf-8", errors="replace").splitlines())


def _sources() -> list[Path]:
    files = [p for tree in TREES for p in (REPO / tree).rglob("*.py")]
    files += [p for p in (REPO / SCRIPTS).iterdir() if p.is_file()]
    return sorted(p for p in files if "__pycache__" not in p.parts)


def test_no_module_is_over_450_lines():
    sizes = {p.relative_to(REPO).as_posix(): _lines(p) for p in _sources()}
    assert "gpujob/ops/target.py" in sizes and "bench/run.py" in sizes and "scripts/test" in sizes
    over = {f: n for f, n in sizes.items() if n > LIMIT}
    assert not over, f"over {LIMIT} lines (split by role rather than grow): {over}"



def test_the_rule_counts_lines_as_the_house_does(tmp_path):
    f = tmp_path / "m.py"
    f.write_text("a = 1\n" * LIMIT)
    assert _lines(f) == LIMIT
    f.write_text("a = 1\n" * LIMIT + "b = 2")  # a last line without its newline still counts
    assert _lines(f) == LIMIT + 1
