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


def test_version_is_answered_without_the_full_cli():
    """`gpujob --version` (the console script's entry) prints the full CLI's line without
    importing typer or rich: start-up is the whole of its cost (issue 24, bench's
    startup_version figure)."""
    import subprocess
    import sys
    code = ("import sys; sys.argv = ['gpujob', '--version']\n"
            "from gpujob import entry\n"
            "try:\n    entry.main()\nexcept SystemExit as e:\n    rc = e.code\n"
            "sys.stderr.write(repr((rc, 'typer' in sys.modules, 'rich' in sys.modules)))")
    fast = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    full = subprocess.run([sys.executable, "-m", "gpujob.cli.main", "--version"], capture_output=True,
                          text=True, timeout=60)
    assert fast.stderr == "(0, False, False)"
    assert fast.stdout == full.stdout and full.returncode == 0
