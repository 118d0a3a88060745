"""The benchmark (bench/, `python -m bench`) in quick mode, so its code cannot rot.

It brings up its own loopback test bed (the benchmark needs 4 sshd's) and runs
every figure with small sizes and one repetition. Timings on a shared CI machine
prove nothing, so nothing here asserts one: only that every figure is produced.
"""

from __future__ import annotations

import json

import pytest

from bench.run import ORDER, main

pytestmark = pytest.mark.testbed

NO_BASELINE = {"latency_p50", "latency_p99", "supervisor_cpu", "supervisor_rss", "startup_version",
               "startup_help"}


def test_quick_bench_produces_every_figure(tmp_path, capsys):
    results = tmp_path / "results.json"
    rc = main(["--quick", "--json", str(results)])
    data = json.loads(results.read_text())
    errors = {f["key"]: f["error"] for f in data["figures"] if f["error"]}
    assert rc == 0 and not errors, errors
    figs = {f["key"]: f for f in data["figures"]}
    assert list(figs) == list(ORDER)
    for key, f in figs.items():
        assert f["ours"] is not None and f["ours"] > 0, key
        if key not in NO_BASELINE:
            assert f["baseline"] is not None and f["baseline"] > 0 and f["ratio"] > 0, key
        assert f["target"], key
    assert figs["latency_p50"]["samples"]["lines_measured"] > 0
    assert set(figs["commands"]["samples"]["breakdown_ms"]) >= {"ssh_channel_true_on_host",
                                                                "pct_exec_true_on_host_no_ssh"}
    assert data["machine"]["nproc"] >= 1 and data["mode"] == "quick"
    table = capsys.readouterr().out
    assert "| figure" in table and "met?" in table
    for f in figs.values():
        assert f["figure"] in table
