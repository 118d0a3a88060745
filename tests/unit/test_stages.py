"""The supervisor's declared state machine (agent/base/stages.py) and its check on every
write of state.json's step (journal.set_state)."""

from __future__ import annotations

import json

import pytest

from gpujob.agent.base import stages
from gpujob.agent.home.journal import Home, Journal
from gpujob.agent.base.stages import IllegalTransition, Stage, TRANSITIONS


def test_the_suite_runs_strict():
    assert stages.strict()


def test_the_table_names_every_stage_and_only_stages():
    assert set(TRANSITIONS) == set(Stage) | {None}
    for frm, tos in TRANSITIONS.items():
        assert tos <= set(Stage), frm


@pytest.mark.parametrize("frm,to", [(None, "env"), ("env", "restore"), ("restore", "warmup"),
                                    ("warmup", "train"), ("train", "succeeded"), ("train", "rollback"),
                                    ("rollback", "restore"), ("train", "train"), ("warmup", "restore"),
                                    ("succeeded", "rollback")])
def test_legal_moves(frm, to):
    assert stages.allowed(frm, to) and stages.check(frm, to) is None


@pytest.mark.parametrize("frm,to", [("succeeded", "train"), ("train", "env"), ("env", "train"),
                                    ("rollback", "train"), (None, "train"), ("train", "bogus")])
def test_illegal_moves_are_refused(frm, to):
    assert not stages.allowed(frm, to)
    with pytest.raises(IllegalTransition, match="illegal stage transition"):
        stages.check(frm, to)


def journal(tmp_path, generation=None) -> Journal:
    j = Journal(Home(str(tmp_path)), "j1", generation)
    (tmp_path / "jobs" / "j1").mkdir(parents=True)
    return j


def test_set_state_checks_every_step_change_in_strict_mode(tmp_path):
    j = journal(tmp_path)
    j.set_state(step=Stage.ENV)
    j.set_state(step=Stage.RESTORE, cache_cold=True)
    with pytest.raises(IllegalTransition):
        j.set_state(step=Stage.SUCCEEDED)
    assert j.state()["step"] == "restore"


def test_in_production_the_last_legal_step_stays_with_an_event_and_a_notification(tmp_path, monkeypatch):
    monkeypatch.delenv("GPUJOB_STRICT_STAGES")
    j = journal(tmp_path)
    told = []
    j.on_internal_error = told.append
    j.set_state(step="env")
    j.set_state(step="succeeded", profile="fast")  # illegal: the rest of the write still lands
    st = j.state()
    assert st["step"] == "env" and st["profile"] == "fast"
    [ev] = [e for e in j.events()[0] if e["type"] == "internal_error"]
    assert "'env' -> 'succeeded'" in ev["error"] and told == [ev["error"]]


def test_a_state_json_written_by_the_previous_agent_for_a_running_job_is_read_and_goes_on(tmp_path):
    """state.json as gpujob 4594edf wrote it mid-training (raw step strings, format 1)."""
    j = journal(tmp_path, generation=3)
    old = {"format": 1, "generation": 3, "job_id": "j1", "name": "tjob", "state": "training",
           "phase": "train",
           "step": "train", "profile": "slow", "resume": False, "warmup_done": [0], "cache_cold": False,
           "child": {"phase": "train", "log": "train.log", "pgid": 4242, "ticks": 1, "exit_file": "x",
                     "log_start": 0, "profile": "slow", "gpu": None, "watch_tps": True},
           "rollbacks": [], "restarts": [], "supervisor_pid": 1, "updated_at": 1.0}
    (tmp_path / "jobs" / "j1" / "state.json").write_text(json.dumps(old))
    st = j.state()
    assert Stage.of(st["step"]) is Stage.TRAIN and st["child"]["pgid"] == 4242
    st = j.set_state(step=Stage.ROLLBACK, pending_rollback={"from": "slow", "to": "fast"})
    assert (st["format"] == 1
            and json.loads((tmp_path / "jobs" / "j1" / "state.json").read_text())["step"] == "rollback")
