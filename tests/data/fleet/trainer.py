"""A stand-in multi-node trainer (stdlib only) for gpujob's fleet tests.

It does what torchrun's c10d rendezvous does at its core, for real: node 0
listens at ``--rdzv-endpoint`` and waits for the other ``--nnodes - 1`` nodes to
connect; every node then prints step lines with its tok/s (the speed of the
``gpujob-demo-kernels`` build in its venv). Node 0 sends every step to the others
over those sockets, so a node that dies ends the others' training with an error
(as a lost NCCL peer would). ``--resume`` continues from its checkpoint.
"""

import argparse
import json
import os
import socket
import sys
import time

import demo_kernels

p = argparse.ArgumentParser()
p.add_argument("--nnodes", type=int, required=True)
p.add_argument("--node-rank", type=int, required=True)
p.add_argument("--rdzv-endpoint", required=True)
p.add_argument("--steps", type=int, default=40)
p.add_argument("--interval", type=float, default=0.1)
p.add_argument("--resume", action="store_true")
args = p.parse_args()

host, _, port = args.rdzv_endpoint.rpartition(":")
host = host.strip("[]")
env = {k: os.environ.get(k) for k in ("NNODES", "NODE_RANK", "MASTER_ADDR", "MASTER_PORT")}
assert env["NODE_RANK"] == str(args.node_rank) and env["MASTER_PORT"] == port, env
step = 0
ckpt = "checkpoint.json"
if args.resume and os.path.exists(ckpt):
    with open(ckpt) as f:
        step = json.load(f)["step"]
    print(f"resumed from checkpoint at step {step}", flush=True)

peers = []
if args.node_rank == 0:
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind((host, int(port)))
    srv.listen(args.nnodes)
    srv.settimeout(120)
    while len(peers) < args.nnodes - 1:
        c, _ = srv.accept()
        rank = int(c.recv(16).decode().strip() or -1)
        peers.append(c)
        print(f"rendezvous: node {rank} joined", flush=True)
    for c in peers:
        c.sendall(b"start\n")
else:
    deadline = time.time() + 120
    while True:
        try:
            c = socket.create_connection((host, int(port)), timeout=5)
            break
        except OSError:
            if time.time() > deadline:
                sys.exit("rendezvous: node 0 never answered at " + args.rdzv_endpoint)
            time.sleep(0.2)
    c.sendall(f"{args.node_rank}\n".encode())
    c.settimeout(60)
    rfile = c.makefile("rb")
    if rfile.readline() != b"start\n":
        sys.exit("rendezvous: no start from node 0")
print(f"rendezvous done: {args.nnodes} nodes, I am node {args.node_rank}, kernels build "
      f"{demo_kernels.BUILD}, CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', '-')}", flush=True)
while step < args.steps:
    time.sleep(args.interval)
    step += 1
    if args.node_rank == 0:
        for c in peers:
            try:
                c.sendall(f"{step}\n".encode())
            except OSError:
                sys.exit(f"RuntimeError: rendezvous peer lost at step {step}")
    else:
        line = rfile.readline()
        if not line:
            sys.exit(f"RuntimeError: rendezvous peer lost at step {step} (node 0 closed)")
        step = int(line)  # node 0's step is the job's (as a collective keeps ranks in step)
    print(f"step {step} | {demo_kernels.TOKENS_PER_SECOND / 1000:.1f}K tok/s", flush=True)
    with open(ckpt + ".tmp", "w") as f:
        json.dump({"step": step}, f)
    os.replace(ckpt + ".tmp", ckpt)
print(f"training finished at step {step}", flush=True)
