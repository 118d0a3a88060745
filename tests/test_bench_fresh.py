"""BENCHMARKS.md's table is not older than the code it measured (bench/measured.py)."""

from __future__ import annotations

import json

from bench import measured


def test_benchmarks_table_is_not_older_than_the_measured_code():
    rec = json.loads(measured.RECORD.read_text())
    changed = measured.stale(rec)
    assert not changed, (
        f"{len(changed)} file(s) under {', '.join(measured.MEASURED)} changed since BENCHMARKS.md's "
        f"table was recorded ({rec.get('recorded_at')}, {rec.get('commit')}): {', '.join(changed[:12])}. "
        "Re-run `python -m bench --json bench/results.json`, put its table in BENCHMARKS.md, then "
        "`python -m bench.measured --record` (or `--record --reason WHY` when no figure can move)")


def test_the_check_sees_a_code_change_but_not_a_comment(tmp_path, monkeypatch):
    mod = tmp_path / "gpujob" / "agent" / "m.py"
    mod.parent.mkdir(parents=True)
    mod.write_text("x = 1\n")
    monkeypatch.setattr(measured, "REPO", tmp_path)
    monkeypatch.setattr(measured, "MEASURED", ("gpujob/agent",))
    rec = {"paths": measured.current()}
    mod.write_text("# a comment\n\nx = 1   \n")
    assert measured.stale(rec) == []
    mod.write_text("x = 2\n")
    assert measured.stale(rec) == ["gpujob/agent/m.py"]
    (tmp_path / "gpujob" / "agent" / "n.py").write_text("y = 1\n")
    assert "gpujob/agent/n.py" in measured.stale(rec)
