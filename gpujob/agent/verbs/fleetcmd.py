"""The agent's ``fleet`` command (stdlib only): what the controller asks of a node of
a multi-node job before and at its start (see agent/fleet/nodes.py for the job itself)."""

from __future__ import annotations

import os

from gpujob.agent.base.wire import Code, FleetAnswer, Refused
from gpujob.agent.verbs import lifecycle


def free_ports(count: int = 2) -> list:
    """Ports free on this node now (bound, then let go): the rendezvous and the channel."""
    import socket
    socks, ports = [], []
    try:
        for _ in range(count):
            s = socket.socket()
            s.bind(("", 0))
            socks.append(s)
            ports.append(s.getsockname()[1])
    finally:
        for s in socks:
            s.close()
    return ports


def primary_address() -> str:
    """This node's address on its default route (no packet is sent), else 127.0.0.1."""
    import socket
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        s.connect(("192.0.2.1", 9))
        return s.getsockname()[0]
    except OSError:
        return "127.0.0.1"
    finally:
        s.close()


def fleet_answer(home, args) -> FleetAnswer:
    """``fleet ports`` (node 0: free ports and its primary address), ``fleet go JOB``
    (the controller took every lock), ``fleet release JOB --reason R`` (another node
    was busy: end this held job, nothing started)."""
    from gpujob.agent.base.protocol import ENDED
    from gpujob.agent.home.journal import Journal
    if args.action == "ports":
        return FleetAnswer(ports=free_ports(2), address=primary_address(), hostname=os.uname().nodename)
    if not args.job:
        raise Refused(f"fleet {args.action} needs a job id", Code.BAD_REQUEST)
    j = Journal(home, args.job)
    if not os.path.exists(j.path("job.json")):
        raise Refused(f"no job {args.job} in this container", Code.UNKNOWN_JOB)
    if j.effective_state().get("state") in ENDED:
        return FleetAnswer(job_id=args.job, state=j.effective_state().get("state"), already=True)
    if args.action == "go":
        j.request("go")
    else:
        j.request("stop", reason=args.reason or "another node could not start")
    return FleetAnswer(job_id=args.job, requested=args.action)


def cmd_fleet(home, args) -> None:
    lifecycle.emit(fleet_answer(home, args))
