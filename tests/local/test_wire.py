"""The laptop <-> agent API declared (gpujob/agent/base/wire.py): each record round-trips and
reads another shape as one line, every refusal carries a code the laptop maps to an exit code,
the name rules are one, and docs/wire.md names every verb and code (so the doc cannot drift)."""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from gpujob.agent import main as agent_main
from gpujob.agent.base import protocol, wire
from gpujob.agent.base.fsio import write_json
from gpujob.agent.base.wire import Code
from gpujob.agent.home import ledgerfile
from gpujob.agent.home.journal import Home
from gpujob.errors import InputError, JobError

REPO = Path(__file__).resolve().parents[2]

EXAMPLES = [
    wire.SubmitRequest("wj-abcd", {"name": "wj", "profiles": [{"name": "a", "env_key": "k1"}]}, "a",
                       {"a": "k1"}, "h123", clear_caches=True, secret_names=["env.TOKEN"],
                       env_passthrough=["HF_*"], secrets={"env": {"TOKEN": "s"}}, fleet={"node_rank": 1},
                       by="alice@laptop", uv="/h/bin/uv", resume_from_ask="old-job", resume_from_copy=True,
                       accept_baseline=True, boot_hook=False, sync_streams=[{"dest": "code", "size": 10240}],
                       extra={"from_a_newer_laptop": 1}),
    wire.SubmitRequest("wj-abcd", {"name": "wj"}, "a", {}, "h"),
    wire.SyncStream("code", 10240),
    wire.SubmitAnswer("wj-abcd", 4242, {"code": 3}, stale_lock={"job_id": "old", "pid": 9},
                      checkpoints={"left": [], "left_count": 0}),
    wire.StatusAnswer([{"job_id": "wj-abcd", "state": "training", "ledger": {}}], {"job_id": "wj-abcd"}),
    wire.StatusAnswer([], None),
    wire.StopAnswer("wj-abcd", "stopped", left=[12], save_waited={"waited": 2.5, "finished": True}),
    wire.StopAnswer("wj-abcd", None, already=True),
    wire.RollbackAnswer("wj-abcd", "fast", "slow", restarted=True, supervisor_pid=7, was="failed"),
    wire.LedgerAnswer("wj", ledger={"profiles": {}}, id=3, profile="a", before="untried", status="good",
                      reason="set by hand", undone={"id": 2}, history=[{"id": 1}],
                      extra={"kept_as": "/h/ledger/wj.json.damaged-1"}),
    wire.ManifestRequest({"code": ["a.py", "sub/b.py"], "data": []}),
    wire.ManifestAnswer({"code": {"a.py": [10, 1700000000]}, "data": {}}),
    wire.ProbeAnswer("3.9.2", "x86_64", "Linux", "/h", 12, True, 10 ** 12, "/h", False, None, None, None),
    wire.PutAnswer("/h/bin/uv", 123),
    wire.ProfilesAnswer([{"env_key": "k1", "installed": True}],
                        {"wj": {"profiles": {}}, "bad": {"error": "x"}}, {"apparent": 10}),
    wire.FleetAnswer(ports=[4000, 4001], address="10.0.0.2", hostname="n0"),
    wire.FleetAnswer(job_id="wj-1", state="stopped", already=True),
    wire.GcAnswer([{"env_key": "k", "why": "remove"}], [], [], [], True, 30.0, None, 2),
    wire.CacheAnswer(caches=[{"env_key": "k"}], uv_cache=0),
    wire.CacheAnswer(ok=False, extra={"reason": "exit 1", "gpus": [0], "ledger_proof": None}),
    wire.TailHead(1234, 34),
    wire.ErrorAnswer("container busy: …", True, "busy"),
    wire.ErrorAnswer("TypeError: x"),
]


@pytest.mark.parametrize("rec", EXAMPLES, ids=lambda r: type(r).__name__)
def test_each_declared_record_round_trips_through_json(rec):
    sent = json.dumps(rec.to_dict())
    assert type(rec).from_dict(json.loads(sent)) == rec
    assert json.loads(sent) == rec.to_dict()


def test_the_json_keys_are_the_ones_the_agent_always_wrote():
    back = wire.RollbackAnswer("j", "fast", "slow", requested=True).to_dict()
    assert back == {"job_id": "j", "from": "fast", "to": "slow", "requested": True}
    assert wire.StatusAnswer([], None).to_dict() == {"jobs": [], "lock": None}
    assert wire.StopAnswer("j", None).to_dict() == {"job_id": "j", "state": None, "left": []}
    assert wire.ErrorAnswer.of(protocol.NewerFormat("x")).to_dict() == \
        {"error": "x", "refused": True, "code": "newer_format"}
    assert wire.ErrorAnswer.of(KeyError("k")).to_dict() == {"error": "KeyError: 'k'"}


@pytest.mark.parametrize("cls, data, line", [
    (wire.StatusAnswer, {"jobs": "x", "lock": None}, "StatusAnswer: jobs: expected List[dict], got str"),
    (wire.StatusAnswer, {"lock": None}, "StatusAnswer: jobs: missing"),
    (wire.SubmitAnswer, {"job_id": "j", "supervisor_pid": True},
     "SubmitAnswer: supervisor_pid: expected int, got bool"),
    (wire.StopAnswer, {"job_id": 3, "state": None}, "StopAnswer: job_id: expected str, got int"),
    (wire.RollbackAnswer, {"job_id": "j", "to": "b"}, "RollbackAnswer: from: missing"),
    (wire.SubmitRequest, [1, 2], "SubmitRequest: expected a JSON object, got list"),
    (wire.ManifestRequest, {"code": "a.py"},
     "ManifestRequest: expected a JSON object of {dest: [path, ...]}"),
    (wire.ProbeAnswer, {"python": "3.9"}, "ProbeAnswer: machine: missing"),
])
def test_a_record_of_another_shape_is_one_line_naming_the_field(cls, data, line):
    with pytest.raises(wire.BadShape) as e:
        cls.from_dict(data)
    assert str(e.value) == line


def test_every_refusal_code_maps_to_one_exit_code():
    from gpujob.ops.target import REFUSALS, refusal_error
    assert set(REFUSALS) == set(Code)
    for code in Code:
        e = refusal_error({"error": f"why {code}", "refused": True, "code": str(code)})
        assert e.exit_code == (2 if code is Code.BAD_REQUEST else 5) and e.refusal == str(code)
        assert e.message == f"why {code}"
    assert isinstance(refusal_error({"error": "x", "refused": True, "code": "bad_request"}), InputError)
    odd = refusal_error({"error": "x", "refused": True, "code": "from-a-newer-agent"})
    assert type(odd) is JobError and odd.exit_code == 5  # a code this gpujob does not know
    assert type(refusal_error({"error": "x", "refused": True})) is JobError  # no code at all


def test_a_refusal_needs_a_code_and_the_agent_refusals_carry_theirs():
    with pytest.raises(TypeError):
        wire.Refused("no code")
    assert protocol.NewerFormat("x").code is Code.NEWER_FORMAT
    assert ledgerfile.Damaged("x").code is Code.DAMAGED and ledgerfile.Busy("x").code is Code.BUSY
    assert isinstance(ledgerfile.LedgerError("x"), wire.Refused)
    assert {Code.BUSY: 1}["busy"] == 1  # a table keyed by codes takes the JSON string


def test_every_refused_raised_in_the_agent_names_its_code():
    """A ``Refused(...)`` built without a code would fail only when it is raised: the scan
    finds one before a user does."""
    bare = []
    for path in (REPO / "gpujob" / "agent").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            name = getattr(node, "func", None) and getattr(node.func, "id", getattr(node.func, "attr", ""))
            if isinstance(node, ast.Call) and name == "Refused" \
                    and len(node.args) < 2 and not any(k.arg == "code" for k in node.keywords):
                if "fleet/channel.py" not in str(path):  # the fleet channel's own (a peer refused)
                    bare.append(f"{path.relative_to(REPO)}:{node.lineno}")
    assert bare == []


def test_the_name_rules_are_one():
    from gpujob.spec import types
    from gpujob.spec.model import JobSpec
    assert f"^{wire.JOB_NAME.pattern}$" in repr(JobSpec.model_fields["name"].metadata)
    assert f"^{wire.PROFILE_NAME.pattern}$" in repr(types.Name.__metadata__)
    assert wire.LEDGER_NAME.fullmatch("wj@x2-0a1b2c") and not wire.LEDGER_NAME.fullmatch("Wj")
    assert wire.JOB_ID.fullmatch("wj-" + "a" * 60) and not wire.JOB_ID.fullmatch("../x")
    for path in ("gpujob/agent/verbs/ledger.py", "gpujob/cli/cache_cmds.py", "gpujob/cli/jobs_cmds.py"):
        assert "[a-z0-9][a-z0-9-]" not in (REPO / path).read_text(), path


def test_docs_wire_names_every_verb_and_every_code():
    doc = (REPO / "docs" / "wire.md").read_text()
    verbs = set(agent_main.COMMANDS) | set(agent_main.LAZY) | {"run"}
    rows = set(re.findall(r"^\| `([a-z-]+)` \| ", doc, re.M))
    assert verbs <= rows, f"docs/wire.md lacks the verbs {sorted(verbs - rows)}"
    assert set(agent_main.parser()._subparsers._group_actions[0].choices) <= rows  # type: ignore[union-attr]
    for code in Code:
        assert f"| `{code}` |" in doc, code
    for verb, cls in wire.ANSWERS.items():
        assert verb in verbs and f"`{cls.__name__}`" in doc, cls


def agent(home, *args, input=None):
    return subprocess.run([sys.executable, "-m", "gpujob.agent.main", "--home", str(home), *args],
                          capture_output=True, input=input, timeout=60)


def answer(p) -> dict:
    lines = p.stdout.decode().splitlines()
    assert len(lines) == 1 and not p.stderr, (p.stdout, p.stderr)
    return json.loads(lines[0])


def test_submit_refuses_a_request_of_another_shape_and_an_id_that_exists(tmp_path):
    p = agent(tmp_path, "submit", input=b'{"job_id": "wj-1", "profile": "a"}\n')
    got = answer(p)
    assert p.returncode == protocol.REFUSED and got["code"] == "bad_request" and got["refused"] is True
    assert "SubmitRequest: spec: missing" in got["error"]
    req = wire.SubmitRequest("../up", {"name": "wj"}, "a", {}, "h")
    got = answer(agent(tmp_path, "submit", input=json.dumps(req.to_dict()).encode() + b"\n"))
    assert got["code"] == "bad_request" and "'../up' is no job id" in got["error"]
    os.makedirs(Home(str(tmp_path)).job_dir("wj-1"))
    req = wire.SubmitRequest("wj-1", {"name": "wj", "profiles": []}, "a", {}, "h")
    p = agent(tmp_path, "submit", input=json.dumps(req.to_dict()).encode() + b"\n")
    got = answer(p)
    assert p.returncode == protocol.REFUSED and got["code"] == "exists", got
    assert os.listdir(tmp_path / "jobs") == ["wj-1"] and not os.path.exists(tmp_path / "lock.json")


def test_the_agent_answers_each_refusal_with_its_code(tmp_path):
    d = Home(str(tmp_path)).job_dir("wj-1")
    os.makedirs(d)
    write_json(os.path.join(d, "job.json"),
               {"spec": {"name": "wj", "profiles": [{"name": "a"}]}, "profile": "a"})
    write_json(os.path.join(d, "state.json"), {"state": "stopped", "profile": "a"})
    cases = [(["status", "nosuch"], "unknown_job"), (["rollback", "wj-1", "--to", "a"], "conflict"),
             (["rollback", "wj-1", "--to", "zz"], "bad_request"),
             (["ledger", "undo", "wj", "9"], "not_found"),
             (["ledger", "show", "Bad_Name"], "bad_request"), (["cache", "restore"], "bad_request"),
             (["fleet", "go", "nosuch"], "unknown_job")]
    for args, code in cases:
        p = agent(tmp_path, *args)
        assert p.returncode == protocol.REFUSED and answer(p)["code"] == code, (args, p.stdout)
    p = agent(tmp_path, "no-such-verb")  # bad usage is no refusal: no code
    assert p.returncode == protocol.USAGE and "code" not in answer(p)
