"""Multi-node specs, each node's values and the fleet channel's signatures: pure, fast."""

from __future__ import annotations

import socket

import pytest
import yaml

from gpujob.agent.fleet import channel
from gpujob.agent.base.placeholders import command_argv, fleet_env, fleet_values
from gpujob.agent.base.planshare import ledger_name
from gpujob.errors import SpecError
from gpujob.ops.fleet import node_info
from gpujob.spec.model import load_spec
from helpers import wait_for

BASE = {
    "name": "fl",
    "profiles": [{"name": "a", "index_url": "https://x/simple", "packages": ["p==1"]}],
    "train": {"command": "torchrun --nnodes {nnodes} --node_rank {node_rank} --rdzv_backend c10d "
                         "--rdzv_endpoint {rdzv_endpoint} --rdzv_id {job_id} train.py"},
}


def load(tmp_path, **over):
    spec = dict(BASE, **over)
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return load_spec(path)


def error(tmp_path, **over) -> str:
    with pytest.raises(SpecError) as e:
        load(tmp_path, **over)
    return str(e.value.message if hasattr(e.value, "message") else e.value)


def test_a_list_target_is_multi_node_and_every_node_gets_its_values(tmp_path):
    spec = load(tmp_path, target=["pve1/ct200", "pve2/ct300"],
                nodes={"on_loss": "wait", "lost_after": "2m", "env": [{"CUDA_VISIBLE_DEVICES": "0"},
                                                                       {"CUDA_VISIBLE_DEVICES": 1}]},
                throughput={"format": "ktok", "min": "1K", "aggregate": "min"})
    assert spec.multi_node and spec.nodes.lost_after == 120 and spec.throughput.aggregate == "min"
    info = node_info(spec, ["pve1/ct200", "pve2/ct300"], 1, "10.0.0.5", 29500, 29501)
    assert info["env"] == {"CUDA_VISIBLE_DEVICES": "1"} and info["on_loss"] == "wait"
    argv = command_argv(spec.train.command, dict(info["values"], job_id="fl-abcd"))
    assert argv[2] == ("torchrun --nnodes 2 --node_rank 1 --rdzv_backend c10d --rdzv_endpoint "
                       "10.0.0.5:29500 --rdzv_id fl-abcd train.py")
    assert fleet_env(info["values"]) == {"NNODES": "2", "NODE_RANK": "1", "MASTER_ADDR": "10.0.0.5",
                                         "MASTER_PORT": "29500"}
    assert fleet_values(2, 0, "fd00::1", 29500)["rdzv_endpoint"] == "[fd00::1]:29500"


def test_multi_node_keys_are_refused_on_a_single_node_job(tmp_path):
    assert "only for a multi-node job" in error(tmp_path, target="ct200")  # {nnodes} in train.command
    single = dict(BASE["train"], command="python t.py")
    assert "nodes: only for a multi-node job" in error(tmp_path, target="ct200", train=single,
                                                       nodes={"on_loss": "end"})
    assert "aggregate: only for a multi-node job" in error(
        tmp_path, target="ct200", train=single, throughput={"format": "ktok", "min": 1, "aggregate": "sum"})


def test_bad_multi_node_input_is_one_clear_line(tmp_path):
    assert "listed twice" in error(tmp_path, target=["a", "a"])
    assert "2 to 64 containers" in error(tmp_path, target=["a"])
    assert "one entry per node (2), got 1" in error(tmp_path, target=["a", "b"],
                                                    nodes={"env": [{"X": "1"}]})
    assert "on_loss" in error(tmp_path, target=["a", "b"], nodes={"on_loss": "retry"})
    assert "start_timeout: expected a duration > 0" in error(tmp_path, target=["a", "b"],
                                                             nodes={"start_timeout": 0})
    assert "secret" in error(tmp_path, target=["a", "b"], nodes={"env": [{"X": {"from_env": "HOME"}}, {}]})


def test_the_ledger_is_per_fleet_shape():
    job = {"spec": {"name": "fl"}}
    assert ledger_name(job) == "fl"
    two = ledger_name(dict(job, fleet={"nnodes": 2, "nodes": ["h/a", "h/b"]}))
    other = ledger_name(dict(job, fleet={"nnodes": 2, "nodes": ["h/a", "h/c"]}))
    assert two.startswith("fl@x2-") and two != other


def test_channel_messages_are_signed_sequenced_and_bound_to_the_connection():
    key = b"k" * 32
    line = channel.seal(key, "nonce-a", 1, {"kind": "sample", "value": 1.0})
    assert channel.open_line(key, "nonce-a", 1, line) == {"kind": "sample", "value": 1.0}
    with pytest.raises(channel.Refused, match="sequence"):  # replayed within the connection
        channel.open_line(key, "nonce-a", 2, line)
    with pytest.raises(channel.Refused, match="signature"):  # replayed on another connection
        channel.open_line(key, "nonce-b", 1, line)
    with pytest.raises(channel.Refused, match="signature"):  # another job's key
        channel.open_line(b"x" * 32, "nonce-a", 1, line)
    forged = line.replace(b"1.0", b"9.0")
    with pytest.raises(channel.Refused, match="signature"):
        channel.open_line(key, "nonce-a", 1, forged)


def leader() -> tuple:
    """A started channel server (key k*32, job-1) on a free loopback port, and the port."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    server = channel.Server(b"k" * 32, port, "job-1", bind="127.0.0.1")
    server.start()
    # it listens from its own thread: a test's raw socket connects only once it does (a real
    # follower's Client retries; without this wait a loaded machine refused the connection)
    wait_for(lambda: server.sock is not None, 30, every=0.01, what="the channel server listening")
    return server, port


def test_a_follower_with_the_wrong_key_is_never_heard(tmp_path):
    server, port = leader()
    good = channel.Client(b"k" * 32, "127.0.0.1", port, "job-1", 1, {"round": 0})
    bad = channel.Client(b"z" * 32, "127.0.0.1", port, "job-1", 2, {"round": 0})
    try:
        bad.start()
        good.start()
        got = server.inbox.get(timeout=10)
        assert got[0] == 1 and got[1]["kind"] == "join"
        assert good.inbox.get(timeout=10) == {"kind": "connected"}
        server.send(1, {"kind": "go", "round": 0})
        assert good.inbox.get(timeout=10) == {"kind": "go", "round": 0}
        assert 2 not in server.connected()
    finally:
        good.close()
        bad.close()
        server.close()


def test_the_channel_hello_names_its_wire_and_version():
    import json as _json
    line = _json.dumps({"wire": "gpujob-fleet", "version": 1, "hello": "n" * 32}).encode()
    assert channel.read_hello(line) == "n" * 32
    with pytest.raises(channel.Refused, match=r"expected a gpujob-fleet hello, got b'SSH-2.0-OpenSSH"):
        channel.read_hello(b"SSH-2.0-OpenSSH_9.2\r\n")  # the port is some other service
    with pytest.raises(channel.Refused, match="expected a gpujob-fleet hello"):
        channel.read_hello(_json.dumps({"hello": "n" * 32}).encode())  # an older leader's hello
    with pytest.raises(channel.Refused, match="the leader speaks gpujob-fleet version 2, this node speaks 1"):
        channel.read_hello(_json.dumps({"wire": "gpujob-fleet", "version": 2, "hello": "n" * 32}).encode())


def test_a_follower_of_another_wire_version_is_refused_with_its_reason():
    server, port = leader()
    c = socket.create_connection(("127.0.0.1", port), timeout=5)
    try:
        rfile = c.makefile("rb")
        theirs = channel.read_hello(rfile.readline())
        join = {"kind": "join", "job": "job-1", "rank": 1, "nonce": "m" * 32, "version": 2}
        c.sendall(channel.seal(b"k" * 32, theirs, 1, join))
        rank, body = server.inbox.get(timeout=10)
        assert rank == 1 and body == {"kind": "refused",
                                      "why": "the follower speaks gpujob-fleet version 2, the leader 1"}
        assert 1 not in server.connected()
    finally:
        c.close()
        server.close()
