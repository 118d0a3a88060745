"""The ledger's append-only history (agent/home/journal.py Ledger): ids, evidence, legacy
entries of an older gpujob, undo restoring the baseline a verdict replaced."""

from __future__ import annotations

import json

from gpujob.agent.home.journal import Home
from gpujob.agent.home.ledger import Ledger
from helpers import cli, cli_json, local_env


def test_every_verdict_is_kept_with_its_evidence_and_undo_restores_the_baseline(tmp_path):
    led = Ledger(Home(str(tmp_path)), "tjob")
    led.mark("fast", "good", baseline=12000.0, job="j1", reason="held")
    led.mark("fast", "good", baseline=4000.0, job="j2", reason="held")  # the slow run's baseline won
    led.mark("slow", "bad", job="j2", reason="median 4K < 10K",
             evidence={"median": 4000.0, "window_medians": [4000.0, 4100.0], "threshold": 10000.0})
    hist = led.history()
    assert [h["id"] for h in hist] == [1, 2, 3]
    assert hist[2]["window_medians"] == [4000.0, 4100.0] and hist[2]["threshold"] == 10000.0
    assert hist[2]["job"] == "j2" and hist[2]["time"] > 0 and hist[1]["baseline"] == 4000.0
    led.undo(2)
    assert led.baseline("fast") == 12000.0
    led.undo(3)
    assert led.status("slow") == "untried"
    hist = led.history()
    assert [h["id"] for h in hist] == [1, 2, 3, 4, 5] and hist[3]["undoes"] == 2  # append-only
    assert led.read()["last_good"] == "fast"


def test_a_ledger_written_by_an_older_gpujob_shows_its_entries_as_legacy(tmp_path):
    home = Home(str(tmp_path))
    (tmp_path / "ledger").mkdir()
    (tmp_path / "ledger" / "tjob.json").write_text(json.dumps(
        {"profiles": {"fast": {"status": "good", "baseline": 9000.0, "at": 100.0, "job": "old"},
                      "slow": {"status": "bad", "reason": "r", "at": 50.0}}, "last_good": "fast"}))
    led = Ledger(home, "tjob")
    hist = led.history()
    assert [(h["id"], h["legacy"]) for h in hist] == [("legacy-fast", True), ("legacy-slow", True)]
    led.mark("slow", "good", baseline=3000.0)
    assert [h["id"] for h in led.history()] == ["legacy-fast", 1]
    led.undo("legacy-fast")  # what it replaced is unknown: the profile is untried again
    assert led.status("fast") == "untried" and Ledger.ever_good(led.read())


def test_ledger_history_and_undo_through_the_cli(tmp_path):
    env = local_env(tmp_path)
    cli(["ledger", "set", "box", "tjob", "fast", "good"], env, check=True)
    cli(["ledger", "set", "box", "tjob", "fast", "bad", "--reason", "odd"], env, check=True)
    res = cli_json(["ledger", "history", "box", "tjob", "--json"], env)
    assert [(h["id"], h["status"]) for h in res["history"]] == [(1, "good"), (2, "bad")]
    human = cli(["ledger", "history", "box", "tjob"], env, check=True).stdout.decode()
    assert "fast=bad" in human and "odd" in human
    res = cli_json(["ledger", "undo", "box", "tjob", "2", "--json"], env)
    assert res["status"] == "good"
    p = cli(["ledger", "undo", "box", "tjob", "99"], env)
    assert (p.returncode != 0 and "no verdict '99'" in p.stderr.decode()
            and "Traceback" not in p.stderr.decode())
