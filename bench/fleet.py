"""Multi-node figures: ``python -m bench.fleet [--testbed] [-n 3]``.

A two-node job (the fleet test trainer: a real TCP rendezvous at {rdzv_endpoint})
starts on the slow profile, is rolled back to fast on both nodes, and resumes.
By default the two nodes are two `local` gpujob homes on this machine; with
``--testbed`` they are tb/ct200 and tb2/ct202 of the loopback Proxmox bed (two
sshd's, two LXC containers). One clock (this machine) for every time stamp.

Figures (medians over the runs):
  start        ``gpujob submit`` launched → the last node's first throughput sample
               (venvs built and cached from the first run on: a resubmit)
  rollback     the leader's decision → the last node's trainer started on fast, and
               → the last node's first sample on fast (both nodes training again)

``--torch PYTHON`` runs jobs/fleet-torch.yaml instead (torchrun's c10d rendezvous, a CUDA
all-reduce each step) on that base interpreter's torch: ``--gpus 0,0`` (one GPU shared, gloo)
or ``--gpus 0,1 --backend nccl``; ``--out F`` writes the figures and each run's node logs.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent


def records(path: Path) -> list:
    if not path.exists():
        return []
    return [json.loads(ln) for ln in path.read_text().splitlines() if ln.strip()]


def one_run(env: dict, spec: Path, job_dirs, keep: Path | None = None, profile: str | None = None) -> dict:
    t0 = time.time()
    extra = ["--profile", profile] if profile else []
    p = subprocess.run([sys.executable, "-m", "gpujob.cli.main", "submit", str(spec), "--force", *extra],
                       env=env, capture_output=True, timeout=300)
    if p.returncode != 0:
        raise SystemExit(p.stderr.decode()[-2000:])
    job_id = [ln for ln in p.stdout.decode().splitlines() if ln.startswith("submitted ")][0].split()[1]
    dirs = job_dirs(job_id)
    end = time.time() + 240
    while time.time() < end:
        states = [json.loads((d / "state.json").read_text()).get("state") for d in dirs]
        if all(s in ("succeeded", "failed", "stopped") for s in states):
            break
        time.sleep(0.5)
    if keep is not None:  # the journals, for a look afterwards (--out: beside it)
        import shutil
        for i, d in enumerate(dirs):
            shutil.copy(d / "job.log", Path(os.environ.get("OUT", keep.parent)) / f"{keep.name}-node{i}.log")
    if states != ["succeeded"] * len(dirs):
        raise SystemExit(f"{job_id} ended {states}")
    lead = json.loads((dirs[0] / "state.json").read_text())
    agg = records(dirs[0] / "samples.jsonl")  # node 0 leads: its samples are the fleet's aggregate
    per_profile = {}
    for rec in agg:
        if rec.get("verdict") not in ("warmup", "initial_delay") and rec.get("value") is not None:
            per_profile.setdefault(rec.get("profile"), []).append(rec["value"])
    figures = {"tps": {k: statistics.median(v) for k, v in per_profile.items()},
               "node_tps": [{k: statistics.median(v)
                             for k, v in _by_profile(records(d / "samples.jsonl")).items()}
                            for d in dirs]}
    if not lead.get("rollbacks"):
        firsts = [min(s["t"] for s in records(d / "samples.jsonl")) for d in dirs]
        return dict(figures, start=max(firsts) - t0)
    decided = lead["rollbacks"][0]["decided_at"]
    figures["timings"] = lead["rollbacks"][0].get("timings")
    log = (dirs[0] / "job.log").read_text(errors="replace")
    figures["resumed"] = [ln for ln in log.splitlines()
                          if ln.startswith("resumed from") or "resume:" in ln][-1:]
    figures["slow_last_step"] = max((r.get("step") or 0 for r in records(dirs[-1] / "samples.jsonl")
                                     if r.get("profile") == "slow"), default=None)
    after = [r["value"] for r in agg if r["t"] > decided and r.get("profile") == "fast"]
    figures["fast_after_rollback"] = statistics.median(after) if after else None
    first, started, resumed = [], [], []
    for d in dirs:
        samples = records(d / "samples.jsonl")
        first.append(min(s["t"] for s in samples))
        resumed.append(min(s["t"] for s in samples if s["t"] > decided and s.get("profile") == "fast"))
        started.append(min(e["t"] for e in records(d / "events.jsonl")
                           if e.get("type") == "phase" and e.get("phase") == "train"
                           and e.get("profile") == "fast"))
    return dict(figures, start=max(first) - t0, rollback_trainers=max(started) - decided,
                rollback_training=max(resumed) - decided)


def _by_profile(samples: list) -> dict:
    out: dict = {}
    for rec in samples:
        if rec.get("value") is not None:
            out.setdefault(rec.get("profile"), []).append(rec["value"])
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--testbed", action="store_true")
    ap.add_argument("-n", type=int, default=3)
    ap.add_argument("--torch", metavar="PYTHON", help="run jobs/fleet-torch.yaml (real torchrun, c10d) with "
                    "this base interpreter's torch instead of the stand-in trainer")
    ap.add_argument("--gpus", default="0,0", help="with --torch: CUDA_VISIBLE_DEVICES of node 0 and node 1")
    ap.add_argument("--backend", default="gloo", choices=["gloo", "nccl"],
                    help="with --torch: the process group's backend (nccl wants a GPU per node: --gpus 0,1)")
    ap.add_argument("--trainer-args", default="", help="with --torch: more arguments for the trainer (e.g. a "
                    "model shape: gloo moves gradients through host memory, so it wants more tokens per "
                    "parameter)")
    ap.add_argument("--out", help="write the figures here as JSON")
    args = ap.parse_args(argv)
    from gpujob.ops.wheelhouse import build_indexes, serve
    tmp = Path(tempfile.mkdtemp(prefix="gpujob-bench-fleet-"))
    idx = build_indexes(tmp / "wheelhouse")
    bed = server = None
    if args.testbed:
        from testbed import TestBed
        bed = TestBed.start()
        bed.start_second_host()
        server, url = serve(tmp / "wheelhouse")
        urls = {"fast": f"{url}/fast/simple", "slow": f"{url}/slow/simple"}
        home = "/root/gj-bench-fleet"
        hosts = {n: {"address": "127.0.0.1", "port": port, "user": "root", "identity_file": str(bed.user_key),
                     "known_hosts": str(bed.known_hosts), "containers": {f"ct{v}": {"vmid": v, "home": home}}}
                 for n, port, v in (("tb", bed.ports[0], 200), ("tb2", bed.ports[-1], 202))}
        target = ["tb/ct200", "tb2/ct202"]
        def job_dirs(j):
            return [bed.container_path(f"{home}/jobs/{j}", vmid=v) for v in (200, 202)]
    else:
        urls = {b: p.as_uri() for b, p in idx.items()}
        hosts = {"lab": {"kind": "local", "env_passthrough": ["NCCL_*", "TORCH_SYMM_MEM_*", "NVSHMEM_*",
                                                              "LD_LIBRARY_PATH", "CUDA_HOME"],
                         "containers": {"n0": {"root": str(tmp / "n0")},
                                                           "n1": {"root": str(tmp / "n1")}}}}
        target = ["lab/n0", "lab/n1"]
        job_dirs = lambda j: [tmp / n / "jobs" / j for n in ("n0", "n1")]  # noqa: E731
    (tmp / "hosts.yaml").write_text(yaml.safe_dump({"hosts": hosts}))
    spec = {"name": "bench-fleet", "target": target,
            "sync": [{"src": str(REPO / "tests" / "data" / "fleet"), "dest": ".",
                      "exclude": ["__pycache__", "checkpoint.json"]}],
            "profiles": [{"name": b, "index_url": urls[b], "packages": [f"gpujob-demo-kernels==1.0.0+{b}"]}
                         for b in ("fast", "slow")],
            "profile": "slow",
            "train": {"command": "python3 trainer.py --nnodes {nnodes} --node-rank {node_rank} "
                                 "--rdzv-endpoint {rdzv_endpoint} --steps 30 --interval 0.1",
                      "resume_args": ["--resume"], "grace": "3s"},
            "throughput": {"format": "ktok", "window": 3, "min": "20K", "failure_limit": 2,
                           "no_data_timeout": "60s", "good_after": "1s"},
            "rollback": {"fallback": ["fast"]}}
    if args.torch:  # the real thing: torchrun's c10d rendezvous, a CUDA all-reduce every step
        spec = yaml.safe_load((REPO / "jobs" / "fleet-torch.yaml").read_text())
        spec.update(target=target, profile="slow")
        spec["sync"][0]["src"] = str(REPO / "jobs" / "fleet_torch")
        for prof in spec["profiles"]:
            prof["python"] = args.torch
        spec["nodes"]["env"] = [{"CUDA_VISIBLE_DEVICES": g} for g in args.gpus.split(",")]
        spec["train"]["command"] += f" --backend {args.backend} {args.trainer_args}".rstrip()
        spec["name"] = "bench-fleet-torch"
    (tmp / "job.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    env = dict(os.environ, GPUJOB_HOSTS=str(tmp / "hosts.yaml"), XDG_STATE_HOME=str(tmp / "state"))
    runs = []
    act1 = None
    try:
        if args.torch:  # act 1: the fleet on fast until it is known-good, its baseline
            act1 = one_run(env, tmp / "job.yaml", job_dirs, keep=tmp / "act1" if args.out else None,
                           profile="fast")
            print("act1 " + json.dumps(act1, default=str), flush=True)
        for i in range(args.n + 1):  # the first run builds the venvs: reported apart
            r = one_run(env, tmp / "job.yaml", job_dirs, keep=tmp / f"run{i}" if args.out else None)
            print(("cold " if i == 0 else "warm ")
                  + json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in r.items()},
                               default=str), flush=True)
            if i:
                runs.append(r)
    finally:
        if server:
            server.shutdown()
        if bed:
            bed.stop()
        import shutil
        shutil.rmtree(tmp, ignore_errors=True)
    keys = ("start", "rollback_trainers", "rollback_training")
    med = {k: round(statistics.median(r[k] for r in runs), 3) for k in keys}
    if act1 is not None:
        base = act1["tps"].get("fast")
        med["baseline_tps"] = base
        med["slow_tps"] = statistics.median(r["tps"].get("slow") or 0 for r in runs)
        med["fast_after_rollback_tps"] = statistics.median(r["fast_after_rollback"] or 0 for r in runs)
        med["recovered_pct"] = round(100 * med["fast_after_rollback_tps"] / base, 1) if base else None
        goods = [r["timings"].get("first_good") for r in runs if r.get("timings")]
        med["decision_to_first_good"] = (statistics.median(goods) if all(g is not None for g in goods)
                                         and goods else None)
    result = {"where": "testbed (2 sshd, 2 LXC)" if args.testbed else "2 local homes",
              "trainer": "torchrun c10d (jobs/fleet-torch.yaml)" if args.torch else "stand-in",
              "runs": len(runs), "median_s": med, "act1": act1, "each": runs}
    print(json.dumps(result, default=str))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
