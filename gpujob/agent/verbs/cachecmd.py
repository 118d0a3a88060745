"""The agent's ``cache`` command (stdlib only): ls, clear, restore, prove-cold.

Live caches are ``H/caches/<key>/``, their snapshots ``H/snapshots/<key>/<stamp>/``
(snapshots.py), and what is known of each profile (good, proven cold or only
warm, its snapshot) is in the ledgers ``H/ledger/<job name>.json``.
"""

from __future__ import annotations

import os
import subprocess

from gpujob.agent.home import snapshots
from gpujob.agent.judge import signals
from gpujob.agent.base import answers, defaults, envs, jobenv
from gpujob.agent.base.protocol import FailureSignal
from gpujob.agent.base.protocol import ENDED
from gpujob.agent.home.journal import Home, Journal
from gpujob.agent.home import ledgerfile
from gpujob.agent.home.ledger import Ledger
from gpujob.agent.base.fsio import now
from gpujob.agent.base.wire import CacheAnswer, Code, Refused
from gpujob.agent.verbs import lifecycle


def live_keys(home: Home) -> list:
    root = home.path("caches")
    return sorted(n for n in os.listdir(root) if not n.startswith(".")) if os.path.isdir(root) else []


def matching(keys, profile: str | None) -> list:
    """The keys of one profile (its name or a venv key), or all of them."""
    if not profile:
        return list(keys)
    return [k for k in keys if k.rsplit("-", 1)[0] == profile or k == profile]


def goods_by_key(home: Home) -> dict:
    """env_key -> [(job name, profile, ledger entry)] for every known-good entry."""
    out: dict = {}
    ldir = home.path("ledger")
    for name in sorted(os.listdir(ldir)) if os.path.isdir(ldir) else []:
        if not name.endswith(".json"):
            continue
        try:  # a damaged ledger's entries are not known (gpujob profiles says which)
            led = ledgerfile.load(os.path.join(ldir, name))
        except ledgerfile.LedgerError:
            continue
        for prof, e in (led.get("profiles") or {}).items():
            if e.get("status") == "good" and e.get("env_key"):
                out.setdefault(e["env_key"], []).append((name[:-5], prof, e))
    return out


def snap_row(meta: dict, t: float) -> dict:
    row = {k: meta.get(k) for k in ("name", "at", "files", "bytes", "linked", "profile", "env_key", "job")}
    return dict(row, age=max(0.0, t - meta.get("at", t)), text=snapshots.describe(meta))


def ls(home: Home) -> dict:
    t = now()
    goods = goods_by_key(home)
    rows = []
    for k in sorted(set(live_keys(home)) | set(snapshots.keys(home.root))):
        for _did in snapshots.recover(home.root, k):
            pass
        base = envs.cache_dir(home.root, k)
        stats = envs.tree_stats(base)
        parts = {sub: envs.dir_size(os.path.join(base, sub)) for sub in envs.CACHE_VARS.values()}
        proofs = sorted({e.get("proof") or "unknown" for _n, _p, e in goods.get(k, [])})
        rows.append({"env_key": k, "live": os.path.isdir(base), "size": stats["bytes"],
                     "files": stats["files"],
                     "parts": parts, "age": (t - stats["newest"]) if stats["newest"] else None,
                     "proof": proofs, "snapshots": [snap_row(m, t) for m in snapshots.listing(home.root, k)]})
        # the newest (listed first); the rest counted (agent/base/answers.py)
        answers.cap(rows[-1], "snapshots", 20)
    return answers.cap({"caches": rows, "uv_cache": envs.dir_size(home.path("uv-cache"))}, "caches")


def clear(home: Home, profile: str | None, *, force: bool, with_snapshots: bool, active: set) -> dict:
    keys = matching(live_keys(home), profile)
    skeys = matching(snapshots.keys(home.root), profile) if with_snapshots else []
    busy = active & (set(keys) | set(skeys))
    if busy and not force:
        raise Refused(f"a running job uses the cache of {', '.join(sorted(busy))}; stop it first "
                      "or pass --force", Code.BUSY)
    goods = goods_by_key(home)
    warnings, kept = [], {}
    for k in keys:
        envs.remove_tree(envs.cache_dir(home.root, k))
    for k in sorted(set(keys) | set(skeys)):
        for job, prof, e in goods.get(k, []):
            if e.get("proof") != "cold":
                warnings.append(f"profile {prof} (job {job}, venv {k}) is known-good on a warm cache only: "
                                f"its cold start was never seen to work"
                                + ("" if with_snapshots else "; its snapshot is kept")
                                + f" (gpujob cache prove-cold TARGET -p {prof} tries one)")
    removed = {}
    for k in skeys:
        removed[k] = [m["name"] for m in snapshots.listing(home.root, k)]
        envs.remove_tree(snapshots.snap_root(home.root, k))
    if not with_snapshots:
        for k in keys:
            snap = next(iter(snapshots.listing(home.root, k)), None)
            if snap:
                kept[k] = (f"the next start of a known-good profile on it restores its "
                           f"{snapshots.describe(snap)}")
    return {"cleared": keys, "snapshots_kept": kept, "snapshots_removed": removed, "warnings": warnings}


def restore(home: Home, profile: str, *, active: set) -> dict:
    keys = matching(snapshots.keys(home.root), profile)
    if not keys:
        raise Refused(f"no snapshot of profile {profile} in this container (gpujob cache ls lists them)",
                      Code.NOT_FOUND)
    busy = active & set(keys)
    if busy:
        raise Refused(f"a running job uses the cache of {', '.join(sorted(busy))}; stop it first", Code.BUSY)
    done = []
    for k in keys:
        meta = snapshots.restore(home.root, k)
        if meta:
            done.append({"env_key": k, "snapshot": meta["name"], "files": meta["files"],
                         "bytes": meta["bytes"],
                         "seconds": meta["restore_seconds"], "text": snapshots.describe(meta)})
    return {"restored": done}


# ---- prove-cold ----------------------------------------------------------------

def latest_job_with(home: Home, profile: str):
    """(job id, job) of the newest job whose spec has ``profile`` and a warmup."""
    for job_id in reversed(home.job_ids()):
        job = Journal(home, job_id).job()
        spec = job.get("spec") or {}
        if spec.get("warmup") and any(p["name"] == profile for p in spec.get("profiles") or []):
            return job_id, job
    return None, None


def gpus_in_use(home: Home) -> dict:
    """job id -> the GPUs of every job that still runs."""
    out = {}
    for job_id in home.job_ids():
        j = Journal(home, job_id)
        st = j.effective_state()
        if st and st.get("state") not in ENDED:
            spec = j.job().get("spec") or {}
            out[job_id] = sorted({g for ids in (spec.get("gpus") or {}).values() for g in ids})
    return out


def refusal(wanted: list, in_use: dict) -> str | None:
    """Why prove-cold may not run on ``wanted`` GPUs (pure), or None."""
    for job_id, gpus in sorted(in_use.items()):
        both = sorted(set(wanted) & set(gpus))
        if both:
            return f"job {job_id} runs on GPUs {','.join(map(str, both))}; pick others with --gpus"
    return None


def prove_cold(home: Home, profile: str, gpus: list | None) -> dict:
    from gpujob.agent.base.placeholders import command_argv
    job_id, job = latest_job_with(home, profile)
    if job is None:
        raise Refused(f"no job in this container has profile {profile} and a warmup to prove it with",
                      Code.NOT_FOUND)
    spec = job["spec"]
    key = job["env_keys"][profile]
    if not envs.is_installed(home.root, key):
        raise Refused(f"profile {profile}'s venv {key} is not installed; submit a job on it first",
                      Code.NOT_FOUND)
    w = spec["warmup"]
    groups = spec.get("gpus") or {}
    if gpus is None:
        gpus = list(groups.get(w["per_gpu"], [])) if w.get("per_gpu") else \
            sorted({g for ids in groups.values() for g in ids})
    why = refusal(gpus, gpus_in_use(home))
    if why:
        raise Refused(f"prove-cold refused: {why}", Code.BUSY)
    prof = next(p for p in spec["profiles"] if p["name"] == profile)
    scratch = home.path("caches", f".prove-{key}-{os.getpid()}")
    envs.remove_tree(scratch)
    os.makedirs(scratch)
    os.makedirs(home.path("proofs"), exist_ok=True)
    log = home.path("proofs", f"{key}-{snapshots.stamp_of(now())}.log")
    login, _src = jobenv.login_env()
    passed = jobenv.passed_through(dict(os.environ), job.get("env_passthrough") or [])
    cache_env = {var: os.path.join(scratch, sub) for var, sub in envs.CACHE_VARS.items()}
    workdir = home.workdir(spec)
    values = {f"gpus.{g}": ",".join(map(str, ids)) for g, ids in groups.items()}
    values.update(profile=profile, job_id=f"prove-cold-{job_id}", workdir=workdir)
    own = {f"GPUJOB_GPUS_{g.upper()}": ",".join(map(str, ids)) for g, ids in groups.items()}
    own.update(GPUJOB_JOB_ID=values["job_id"], GPUJOB_PROFILE=profile, GPUJOB_HOME=home.root)
    runs = [[g] for g in gpus] if w.get("per_gpu") else [gpus]
    t0, result = now(), {"ok": True, "reason": "every warmup exited 0 on an empty cache"}
    try:
        with open(log, "ab") as f:
            for ids in runs:
                vals = dict(values, gpu=str(ids[0])) if w.get("per_gpu") else values
                argv = command_argv(w["command"], vals)
                env = jobenv.job_env(login, passed, [spec.get("env"), prof.get("env"), cache_env,
                                                     own],
                                     envs.env_dir(home.root, key),
                                     {"CUDA_VISIBLE_DEVICES": ",".join(map(str, ids))})
                f.write(f"[gpujob] prove-cold on GPUs {ids}: {argv}\n".encode())
                f.flush()
                os.makedirs(workdir, exist_ok=True)
                try:
                    p = subprocess.run(argv, env=env, cwd=workdir, stdin=subprocess.DEVNULL, stdout=f,
                                       stderr=subprocess.STDOUT,
                                       timeout=float(defaults.section(spec, "warmup")["timeout"]),
                                       start_new_session=True)
                    code = p.returncode
                except subprocess.TimeoutExpired:
                    code = None
                tail = open(log, "rb").read()[-20000:].decode("utf-8", "replace").splitlines()[-200:]
                name, reason = signals.classify_exit(code if code is None or code >= 0 else None,
                                                        -code if code is not None and code < 0 else None,
                                                     tail,
                                                        (spec.get("rollback") or {}).get("error_signatures")
                                                     or [],
                                                        log_name="the warmup's log")
                if code is None:
                    name, reason = FailureSignal.CRASH, f"timed out after {w.get('timeout', 3600.0)}s"
                if name != "ok":
                    result = {"ok": False, "reason": f"GPUs {ids}: {reason}", "signal": name}
                    break
    finally:
        envs.remove_tree(scratch)
    rec = dict(result, at=now(), seconds=round(now() - t0, 2), gpus=gpus, log=log, env_key=key, job=job_id)
    led = Ledger(home, spec["name"])
    entry = led.read()["profiles"].get(profile) or {}
    extra = {"proof": "cold"} if result["ok"] and entry.get("env_key", key) == key else {}
    led.note(profile, cold_proof=rec, **extra)
    return dict(rec, profile=profile, name=spec["name"],
                ledger_proof=led.read()["profiles"][profile].get("proof"))


def cmd_cache(home: Home, args) -> None:
    if args.action == "ls":
        res = ls(home)
    elif args.action == "clear":
        res = clear(home, args.profile, force=args.force, with_snapshots=args.snapshots,
                    active=lifecycle.active_keys(home))
    elif not args.profile:
        raise Refused(f"cache {args.action} needs --profile", Code.BAD_REQUEST)
    elif args.action == "restore":
        res = restore(home, args.profile, active=lifecycle.active_keys(home))
    else:
        gpus = [int(g) for g in args.gpus.split(",") if g.strip()] if args.gpus else None
        res = prove_cold(home, args.profile, gpus)
    lifecycle.emit(CacheAnswer.from_dict(res))
