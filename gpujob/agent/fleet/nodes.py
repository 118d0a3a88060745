"""One job over several containers (stdlib only): node 0's supervisor leads, the
others follow, over the signed channel of ``channel.py``.

- **Hold**: every node's supervisor is started holding its container lock and waits
  for the controller's ``go`` (sent only once every node's lock is taken), so a busy
  or unreachable node means nothing starts anywhere.
- **Barrier**: a trainer starts only when every node is ready for the same round
  (a round = one start of the trainers on one profile); the leader says ``go``.
- **One decision**: followers report samples, failures and their end; the leader
  runs the policy on the aggregate (``throughput.aggregate``: sum or min of the
  nodes' latest tok/s), and every rollback or restart it decides is a ``relaunch``
  of a new round on one profile: every node stops its trainer, switches to that
  profile and waits at the barrier; all resume together with ``resume_args``.
- **Losses**: a follower silent longer than ``nodes.lost_after`` ends the job
  (``nodes.on_loss: end``) or is waited for (``wait``); a follower keeps its
  trainer running while the leader is away and reconnects to a revived leader.
"""

from __future__ import annotations

from gpujob.agent.fleet.follower import Follower
from gpujob.agent.fleet.leader import Leader
from gpujob.agent.fleet.node import NodePort


def make(port: NodePort):
    info = port.job.get("fleet")
    if not info:
        return None
    return (Leader if info["node_rank"] == 0 else Follower)(port, info)
