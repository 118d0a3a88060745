"""The supervisor as composition (docs/architecture.md): it inherits nothing, and a node of
a multi-node job reaches it only through the port ``fleet.node.NodePort`` declares, which
``supervisor.FleetPort`` answers in full."""

from __future__ import annotations

import ast
import inspect
from types import SimpleNamespace

from gpujob.agent.fleet import follower, leader, node, nodes
from gpujob.agent.supervisor.parts import History, StopFlag
from gpujob.agent.supervisor.supervisor import FleetPort, Supervisor


def _port_names() -> set:
    """What NodePort declares: its fields, properties and methods."""
    own = {n for n in vars(node.NodePort) if not n.startswith("_")}
    return own | set(node.NodePort.__annotations__)


#: the fleet's nodes: the shared base, the leader, the follower and make()
NODE_SOURCES = "\n".join(inspect.getsource(m) for m in (node, leader, follower, nodes))


def test_the_supervisor_is_no_mixin():
    assert Supervisor.__mro__ == (Supervisor, object)


def test_a_node_reaches_its_supervisor_only_through_the_port():
    used = set()
    for n in ast.walk(ast.parse(NODE_SOURCES)):
        if isinstance(n, ast.Attribute):
            base = n.value
            if isinstance(base, ast.Name) and base.id == "port":  # port.X (a constructor)
                used.add(n.attr)
            elif isinstance(base, ast.Attribute) and base.attr == "port" and \
                    isinstance(base.value, ast.Name) and base.value.id == "self":  # self.port.X
                used.add(n.attr)
    assert used, "the nodes no longer read their port: this check reads nothing"
    assert used <= _port_names(), f"the nodes use {sorted(used - _port_names())} outside NodePort"
    assert "sup" not in {a.arg for f in ast.walk(ast.parse(NODE_SOURCES))
                         if isinstance(f, ast.FunctionDef) for a in f.args.args}


def test_the_fleet_port_answers_everything_the_port_declares():
    job = SimpleNamespace(job_id="j", job={"fleet": None}, spec={"name": "n"})
    report = SimpleNamespace(say=lambda text: None, set_state=lambda *a, **k: None)
    stop, history = StopFlag(), History({"restarts": [{"on": "a"}]})
    port = FleetPort(job, "journal", report, SimpleNamespace(secrets=lambda: {}), stop, history,
                     finish=lambda *a, **k: None, plan_rollback=lambda *a, **k: None, requests=lambda: None)
    port.judge_sample = lambda run, value, step, t: None  # (the supervisor binds the watch's)
    missing = sorted(n for n in _port_names() if not hasattr(port, n))
    assert missing == []
    assert (port.job_id, port.spec, port.journal, port.stop_asked, port.restarts) == \
        ("j", {"name": "n"}, "journal", False, [{"on": "a"}])
    stop.asked = True
    history.add_restart({"on": "b"})
    assert port.stop_asked is True and len(port.restarts) == 2  # read live, not copied at construction
