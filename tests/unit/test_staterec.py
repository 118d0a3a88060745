"""state.json's keys as one typed record (agent/base/staterec.py), checked on every write
(journal.set_state, the one function that writes the file) and read the same way by the
agent and the laptop (show/render.status_view). tests/data/state holds three files the
agent of 7231922 wrote in a real local-kind run (before the record existed)."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from gpujob.agent.base import staterec
from gpujob.agent.base.protocol import JobState
from gpujob.agent.base.stages import IllegalTransition, Stage
from gpujob.agent.base.staterec import KEYS, BadStateKey, StateRecord
from gpujob.agent.home.journal import Home, Journal
from gpujob.show import render

ROOT = Path(__file__).resolve().parents[2]
RECORDED = sorted((ROOT / "tests" / "data" / "state").glob("*.json"))
# the functions that pass their keyword arguments on into one state write
FORWARDERS = {"set_state", "finish", "activate", "cache_step", "train", "publish"}


def journal(tmp_path, generation=None, state=None) -> Journal:
    (tmp_path / "jobs" / "j1").mkdir(parents=True)
    if state is not None:
        (tmp_path / "jobs" / "j1" / "state.json").write_text(json.dumps(state))
    return Journal(Home(str(tmp_path)), "j1", generation)


def written_keys() -> dict:
    """Every keyword the agent's code passes into a state write: {key: [where]}."""
    found: dict = {}
    for p in sorted((ROOT / "gpujob").rglob("*.py")):
        for n in ast.walk(ast.parse(p.read_text())):
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr in FORWARDERS:
                for kw in n.keywords:
                    if kw.arg and kw.arg != "durable":
                        found.setdefault(kw.arg, []).append(f"{p.relative_to(ROOT)}:{n.lineno}")
    return found


def test_every_key_the_code_writes_is_declared():
    keys = written_keys()
    assert len(keys) > 40  # the scan sees the writers (it would pass on nothing otherwise)
    undeclared = {k: v for k, v in keys.items() if k not in KEYS}
    assert not undeclared, f"declare these in staterec.StateRecord: {undeclared}"


def test_every_declared_key_has_its_types_and_meaning():
    assert len(KEYS) == 56
    for k in KEYS.values():
        assert k.types and all(isinstance(t, type) for t in k.types) and len(k.meaning) > 10, k


@pytest.mark.parametrize("path", RECORDED, ids=lambda p: p.stem)
def test_a_state_json_the_previous_agent_wrote_is_a_whole_record(path):
    data = json.loads(path.read_text())
    assert data["format"] == 1
    rec = StateRecord.from_dict(data)
    assert rec.extra == {}, "every key the old agent wrote is declared, with its type"
    assert staterec.problems(data) == []
    assert rec.stage is Stage.TRAIN and rec.job_state in (JobState.TRAINING, JobState.STOPPED)
    assert {k: v for k, v in data.items() if v is not None} == rec.to_dict()


def test_the_recorded_running_job_is_read_and_goes_on_through_the_journal(tmp_path):
    old = json.loads((ROOT / "tests/data/state/running_after_rollback.json").read_text())
    j = journal(tmp_path, generation=old["generation"], state=old)
    rec = j.record()
    assert (rec.profile == "fast" and rec.rollback_list[0]["from"] == "slow"
            and rec.child["pgid"] == old["child_pgid"])
    st = j.set_state(step=Stage.ROLLBACK, pending_rollback={"from": "fast", "to": "slow", "reason": "x"})
    assert st["step"] == "rollback" and st["format"] == 1
    again = json.loads((tmp_path / "jobs/j1/state.json").read_text())
    # nothing of the old file lost
    assert {k: again[k] for k in old if k not in ("step", "updated_at", "pending_rollback")} == \
        {k: old[k] for k in old if k not in ("step", "updated_at", "pending_rollback")}


def test_unknown_and_mistyped_keys_in_an_old_file_crash_no_reader_and_are_kept(tmp_path):
    old = {"format": 1, "state": "training", "step": "train", "phase": "train", "profile": "fast",
           "from_a_newer_agent": {"x": 1}, "tps": "fast!", "window": [1, 2], "tps_recent": "abc",
           "rollbacks": [{"from": "a", "to": "b"}, "junk"]}
    j = journal(tmp_path, state=old)
    rec = j.record()
    assert rec.profile == "fast" and rec.tps is None and rec.window is None
    assert rec.extra == {"from_a_newer_agent": {"x": 1}, "tps": "fast!", "window": [1, 2],
                         "tps_recent": "abc"}
    assert rec.rollback_list == [{"from": "a", "to": "b"}]
    j.set_state(reason="still written")  # the write changes only what it names
    kept = json.loads((tmp_path / "jobs/j1/state.json").read_text())
    assert kept["from_a_newer_agent"] == {"x": 1} and kept["reason"] == "still written"
    assert StateRecord.from_dict("not a dict") == StateRecord()


def test_a_step_or_state_this_version_does_not_know_is_read_as_its_string():
    rec = StateRecord.from_dict({"step": "compile", "state": "paused"})
    assert rec.step == "compile" and rec.stage is None and rec.job_state is None and rec.state == "paused"


@pytest.mark.parametrize("changes,says", [
    ({"note": "x"}, "'note' is not declared"),
    ({"tps": "fast"}, "'tps': expected int or float, got str"),
    ({"exit_code": True}, "'exit_code': expected int, got bool"),
    ({"resume": 1}, "'resume': expected bool, got int"),
    ({"state": "sleeping"}, "'sleeping' is none of preparing"),
    ({"phase": "compile"}, "'compile' is none of start"),
])
def test_a_write_the_record_does_not_declare_fails_loudly_in_strict_mode(tmp_path, changes, says):
    j = journal(tmp_path, state={"format": 1, "state": "training", "step": "train", "phase": "train"})
    before = (tmp_path / "jobs/j1/state.json").read_text()
    with pytest.raises(BadStateKey, match=says):
        j.set_state(**changes)
    assert (tmp_path / "jobs/j1/state.json").read_text() == before


def test_an_undeclared_stage_transition_fails_loudly_in_strict_mode(tmp_path):
    j = journal(tmp_path, state={"format": 1, "state": "training", "step": "train"})
    with pytest.raises(IllegalTransition):
        j.set_state(step=Stage.ENV)


def test_in_production_an_undeclared_key_is_written_and_said(tmp_path, monkeypatch):
    monkeypatch.delenv("GPUJOB_STRICT_STAGES")
    j = journal(tmp_path)
    told = []
    j.on_internal_error = told.append
    j.set_state(tps="oops", profile="fast")
    assert j.state()["tps"] == "oops" and j.state()["profile"] == "fast"
    [ev] = [e for e in j.events()[0] if e["type"] == "internal_error"]
    assert "'tps': expected int or float" in ev["error"] and told == [ev["error"]]


def test_the_laptop_reads_the_status_answer_through_the_same_record():
    st = json.loads((ROOT / "tests/data/state/running_after_rollback.json").read_text())
    v = render.status_view(dict(st, ledger={"profiles": {"fast": {"status": "good"}}}, now=st["updated_at"]),
                           "box")
    assert (v["state"], v["phase"], v["profile"], v["tok_s"]) == ("training", "train", "fast", st["tps"])
    assert v["window_median"] == st["window"]["median"] and v["trend"] == st["tps_recent"]
    assert v["rollbacks"][0]["to"] == "fast" and v["ledger"] == {"fast": {"status": "good"}}
    assert v["uptime_s"] == pytest.approx(st["updated_at"] - st["started_at"])


def test_a_status_answer_with_mistyped_values_still_renders():
    v = render.status_view({"job_id": "j", "state": "failed", "window": [1], "tps_recent": "abc",
                            "exit_code": "3", "rollbacks": ["x"], "started_at": "t", "ledger": []}, "box")
    assert v["window_median"] is None and v["trend"] == [] and v["rollbacks"] == [] and v["exit"] == ""
    assert v["uptime_s"] is None and v["ledger"] == {}


WRITES = {"write_json", "write_bytes", "replace", "rename"}
WRITE_FLAGS = {"O_WRONLY", "O_RDWR", "O_CREAT", "O_TRUNC", "O_APPEND"}


def _writes(call: ast.Call, name: str) -> bool:
    if name in WRITES:
        return True
    if name != "open":
        return False
    mode = [a for a in call.args[1:2] if isinstance(a, ast.Constant)] + \
        [k.value for k in call.keywords if k.arg == "mode" and isinstance(k.value, ast.Constant)]
    flags = {c.attr for a in call.args[1:] for c in ast.walk(a) if isinstance(c, ast.Attribute)}
    return any(set(str(m.value)) & set("wax+") for m in mode) or bool(flags & WRITE_FLAGS)


def state_json_writers(source: str) -> list:
    """Lines of ``source`` that write a file with "state.json" in the path they are given."""
    out = []
    for n in ast.walk(ast.parse(source)):
        if isinstance(n, ast.Call):
            f = n.func
            name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None
            if name and _writes(n, name) and any(isinstance(c, ast.Constant) and c.value == "state.json"
                                                 for a in n.args for c in ast.walk(a)):
                out.append(n.lineno)
    return out


def test_only_the_journal_writes_state_json():
    found = {str(p.relative_to(ROOT)): state_json_writers(p.read_text())
             for p in sorted((ROOT / "gpujob").rglob("*.py"))}
    journal = "gpujob/agent/home/journal.py"
    assert {k: v for k, v in found.items() if v} == {journal: found[journal]}
    assert len(found["gpujob/agent/home/journal.py"]) == 1  # set_state's write_json (sync only fsyncs it)
    for planted in ('write_json(os.path.join(d, "state.json"), st)', 'open(j.path("state.json"), "w")',
                    'os.open(p("state.json"), os.O_WRONLY | os.O_CREAT)'):
        assert state_json_writers(planted + "\n"), planted  # the scan sees a planted writer
    assert not state_json_writers('open(j.path("state.json"))\n')  # a reader is no writer


def test_status_shows_judging_suspended_and_never_a_median_equal_to_its_threshold():
    """Issue 38 item 5: `status` kept printing `window median 1.2M < 1.2M ..., 3/3 breaches`
    while judging was suspended and said nothing of it."""
    import io
    from rich.console import Console
    st = json.loads((ROOT / "tests/data/state/running_after_rollback.json").read_text())
    st = dict(st, tps=1_206_000.0, window=dict(st["window"], median=1_206_000.0, threshold=1_228_000.0,
                                               threshold_source="min_ratio 0.9 × baseline 1.36M",
                                               consecutive_breaches=412, breach_for=7.4, failure_limit="20s"),
              judging_suspended={"since": st["updated_at"] - 30, "profile": "fast", "baseline": 1_365_000.0,
                                 "no_recovery": True, "reason": "no recovery on fast: not the profile"})
    v = render.status_view(dict(st, now=st["updated_at"]), "box")
    out = io.StringIO()
    render.print_status(Console(file=out, width=200), v)
    text = out.getvalue()
    assert "1.2M < 1.2M" not in text and "1,206,000 < 1,228,000" in text
    assert "breaching for 7s (failure_limit 20s" in text
    assert "suspended" in text and "no recovery" in text and "comes back when fast holds" in text
    assert "1.36M" in text  # the baseline it comes back against
