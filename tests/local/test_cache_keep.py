"""Known-good means wheels *and* compile cache (issue 14), on the `local` target with
real venvs: a warmup that writes "kernels" into the profile's cache dirs (the job env
points TORCHINDUCTOR_CACHE_DIR etc. there) and a trainer that reports which kernels it
found. Known-good → a snapshot; `cache clear` → the next start restores it and the
trainer finds its kernels; a cold start that fails with an error signature is retried
once on the restored cache; a profile proven only warm is warned about, and
`cache prove-cold` proves it cold (refused under a running job on the same GPUs)."""

from __future__ import annotations

import json
import os
import re
import signal
import textwrap
import time
from pathlib import Path

import yaml

from helpers import cli, cli_json, events, job_id_of, local_env, wait_for

WARMUP = textwrap.dedent("""
    # writes "kernels" (tagged with the job that compiled them) into the profile's caches;
    # with --race it fails like torch.compile(flex_attention) from cold: only when no kernel is there
    import os, sys
    ind = os.environ["TORCHINDUCTOR_CACHE_DIR"]
    have = os.path.isdir(ind) and any(n.startswith("kern") for n in os.listdir(ind))
    if "--race" in sys.argv and not have:
        print("torch._dynamo.exc.InternalTorchDynamoError: is_fx_symbolic_tracing (3 drafter threads)")
        sys.exit(1)
    n = int(sys.argv[sys.argv.index("--many") + 1]) if "--many" in sys.argv else 3
    if not have:
        for var in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "TORCH_EXTENSIONS_DIR"):
            os.makedirs(os.environ[var], exist_ok=True)
            for i in range(n):
                with open(os.path.join(os.environ[var], "kern%d.py" % i), "w") as f:
                    f.write("compiled by %s\\n" % os.environ["GPUJOB_JOB_ID"])
    print("warmup done (cache was %s)" % ("warm" if have else "cold"))
""")

TRAINER = textwrap.dedent("""
    import os, sys, time
    ind = os.environ["TORCHINDUCTOR_CACHE_DIR"]
    kern = os.path.join(ind, "kern0.py")
    if os.path.exists(kern):
        print("kernels found: compiled by " + open(kern).read().split()[-1])
        print("kernel files: %d" % len(os.listdir(ind)))
    else:
        print("kernels missing")
    if os.environ.get("BREAK"):
        print("RuntimeError: is_fx_symbolic_tracing (a broken build)")
        sys.exit(1)
    if "--sleep" in sys.argv:
        time.sleep(float(sys.argv[-1]))
""")


def setup(tmp_path: Path, name: str = "kjob", warmup: str = "python warmup.py",
          train: str = "python trainer.py"):
    code = tmp_path / "code"
    code.mkdir(exist_ok=True)
    (code / "warmup.py").write_text(WARMUP)
    (code / "trainer.py").write_text(TRAINER)
    spec = {"name": name, "target": "box", "sync": [{"src": str(code), "dest": "."}],
            "gpus": {"target": [0, 1], "drafter": [2, 3]},
            "profiles": [{"name": "fast", "system_site_packages": True}], "profile": "fast",
            "warmup": {"command": warmup, "timeout": "1m"},
            "train": {"command": train, "grace": "3s"}}
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def set_warmup(path: Path, command: str) -> None:
    data = yaml.safe_load(path.read_text())
    data["warmup"]["command"] = command
    path.write_text(yaml.safe_dump(data, sort_keys=False))


def run_job(spec: Path, env: dict, *extra, ok: bool = True) -> tuple:
    p = cli(["submit", str(spec), "--follow", *extra], env, timeout=180)
    assert (p.returncode == 0) == ok, p.stdout.decode()[-3000:] + p.stderr.decode()[-2000:]
    job_id = job_id_of(p.stdout)
    jdir = Path(env["GPUJOB_TEST_ROOT"]) / "jobs" / job_id
    return job_id, (jdir / "job.log").read_text(), events(jdir)


def found(log: str) -> str:
    m = re.search(r"^kernels (found: compiled by \S+|missing)", log, re.M)
    assert m, log[-2000:]
    return m.group(1)


def ledger(tmp_path: Path, name: str = "kjob") -> dict:
    return json.loads((tmp_path / "root" / "ledger" / f"{name}.json").read_text())["profiles"]["fast"]


def make_env(tmp_path):
    env = local_env(tmp_path)
    env["GPUJOB_TEST_ROOT"] = str(tmp_path / "root")
    return env


def test_known_good_snapshots_and_a_cleared_cache_is_restored(tmp_path):
    env = make_env(tmp_path)
    spec = setup(tmp_path)
    first, log, ev = run_job(spec, env)
    assert found(log) == f"found: compiled by {first}"
    entry = ledger(tmp_path)
    assert entry["status"] == "good" and entry["proof"] == "cold" and entry["cache_start"] == "cold"
    assert entry["snapshot"]["files"] == 9 and entry["snapshot"]["linked"] == 6  # extensions copied
    snap = [e for e in ev if e["type"] == "cache_snapshot"]
    assert len(snap) == 1 and snap[0]["env_key"] == entry["env_key"]
    ls = cli_json(["cache", "ls", "box", "--json"], env)
    (row,) = ls["caches"]
    assert row["files"] == 10 and len(row["snapshots"]) == 1 and row["snapshots"][0]["files"] == 9
    assert row["proof"] == ["cold"]
    human = cli(["cache", "ls", "box"], env, check=True).stdout.decode()
    assert "snapshots on" in human and row["snapshots"][0]["name"] in human

    p = cli(["cache", "clear", "box", "-p", "fast"], env, check=True)
    text = p.stdout.decode()
    assert "snapshot kept; the next start of a known-good profile on it restores its snapshot of" in text
    assert "warning" not in p.stderr.decode()  # proven cold: nothing to warn about
    assert not (tmp_path / "root" / "caches" / entry["env_key"]).exists()

    second, log, ev = run_job(spec, env)
    assert found(log) == f"found: compiled by {first}"  # the kernels of the first job, restored
    assert re.search(r"cache: restored snapshot of \d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC \(9 files, 0\.0 MB\)",
                     log)
    kinds = [e["type"] for e in ev]
    assert "cache_restored" in kinds and "warmup_skipped" in kinds  # a restored cache counts as warmed
    assert [e for e in ev if e["type"] == "cache_start"][0]["start"] == "restored"
    assert kinds.index("cache_restored") < kinds.index("warmup_skipped")

    # --clear-caches asks for a cold start: obeyed, no restore
    third, log, ev = run_job(spec, env, "--clear-caches")
    assert found(log) == f"found: compiled by {third}"
    assert "cache_restored" not in [e["type"] for e in ev]
    assert "starting cold as asked" in log

    # by hand
    p = cli(["cache", "restore", "box", "-p", "fast"], env, check=True)
    assert "restored snapshot of" in p.stdout.decode()
    key = entry["env_key"]
    kern = tmp_path / "root" / "caches" / key / "inductor" / "kern0.py"
    assert kern.read_text().split()[-1] == first


def test_a_failed_cold_start_is_retried_once_on_the_restored_cache(tmp_path):
    env = make_env(tmp_path)
    spec = setup(tmp_path)
    first, _log, _ev = run_job(spec, env)
    # the cleanup deleted the cache; the warmup now races when it compiles from cold
    set_warmup(spec, "python warmup.py --race")
    second, log, ev = run_job(spec, env, "--clear-caches")
    kinds = [e["type"] for e in ev]
    assert kinds.count("cold_retry") == 1
    retry = next(e for e in ev if e["type"] == "cold_retry")
    assert "is_fx_symbolic_tracing" in retry["reason"]
    restored = [e for e in ev if e["type"] == "cache_restored"]
    assert len(restored) == 1 and restored[0]["why"].startswith("one retry on the restored cache")
    assert found(log) == f"found: compiled by {first}"
    assert "rollback" not in kinds and ledger(tmp_path)["status"] == "good"
    assert "warmup done (cache was warm)" in log

    # with no snapshot (deleted with --snapshots) the same failure is judged at once
    p = cli(["cache", "clear", "box", "-p", "fast", "--snapshots"], env, check=True)
    assert "snapshots deleted (1)" in p.stdout.decode()
    third, log, ev = run_job(spec, env, "--clear-caches", ok=False)
    assert "cold_retry" not in [e["type"] for e in ev]
    assert ledger(tmp_path)["status"] == "good"  # failed with nowhere to go: nothing marked bad (issue 22)


def test_a_profile_known_good_without_a_snapshot_gets_one_when_a_job_on_it_succeeds(tmp_path):
    env = make_env(tmp_path)
    spec = setup(tmp_path)
    run_job(spec, env)
    cli(["cache", "clear", "box", "-p", "fast", "--snapshots"], env, check=True)
    assert cli_json(["cache", "ls", "box", "--json"], env)["caches"] == []
    job, _log, ev = run_job(spec, env)  # still known-good: no new verdict, but a snapshot again
    assert [e["type"] for e in ev].count("cache_snapshot") == 1
    (row,) = cli_json(["cache", "ls", "box", "--json"], env)["caches"]
    assert row["snapshots"][0]["job"] == job and row["snapshots"][0]["files"] == 9


def test_a_profile_proven_only_warm_is_warned_about_and_prove_cold_proves_it(tmp_path):
    env = make_env(tmp_path)
    run_job(setup(tmp_path, name="prewarm"), env)  # another job name compiled the cache
    spec = setup(tmp_path, name="kjob")
    _job, log, _ev = run_job(spec, env)
    assert ledger(tmp_path, "prewarm")["proof"] == "cold"
    entry = ledger(tmp_path)
    assert entry["status"] == "good" and entry["proof"] == "warm" and entry["cache_start"] == "warm"

    p = cli(["cache", "clear", "box", "-p", "fast"], env, check=True)
    warn = p.stderr.decode()
    assert "warning: profile fast (job kjob" in warn and "cold start was never seen to work" in warn
    assert "snapshot is kept" in warn and "prewarm" not in warn

    # prove-cold is refused on GPUs a running job uses
    setup(tmp_path, name="busy", train="python trainer.py --sleep 60")
    busy = job_id_of(cli(["submit", str(tmp_path / "busy.yaml")], env, check=True).stdout)
    busy_log = tmp_path / "root" / "jobs" / busy / "job.log"
    wait_for(lambda: busy_log.exists() and "kernels" in busy_log.read_text(), 60,
             what="the busy job to train")
    p = cli(["cache", "prove-cold", "box", "-p", "fast", "--gpus", "3"], env)
    assert p.returncode != 0 and f"job {busy} runs on GPUs 3" in p.stderr.decode(), p.stderr.decode()
    assert cli(["cache", "prove-cold", "box", "-p", "fast", "--gpus", "x"], env).returncode == 2
    cli(["stop", busy], env, check=True)

    # a warmup that races from cold fails its proof; the ledger keeps "warm"
    set_warmup(spec, "python warmup.py --race")
    run_job(spec, env)  # the latest job with the profile: its warmup is the one proven
    p = cli(["cache", "prove-cold", "box", "-p", "fast", "--gpus", "4,5"], env)
    assert p.returncode != 0 and "FAILED from a cold cache" in p.stdout.decode()
    proof = ledger(tmp_path)["cold_proof"]
    assert ledger(tmp_path)["proof"] == "warm" and proof["ok"] is False
    assert proof["signal"] == "error_signature" and "is_fx_symbolic_tracing" in proof["reason"], proof

    set_warmup(spec, "python warmup.py")
    run_job(spec, env)
    p = cli(["cache", "prove-cold", "box", "-p", "fast", "--gpus", "4,5"], env, check=True)
    assert "works from a cold cache on GPUs 4,5" in p.stdout.decode()
    entry = ledger(tmp_path)
    assert entry["proof"] == "cold" and entry["cold_proof"]["ok"] is True
    assert Path(entry["cold_proof"]["log"]).read_text().count("warmup done (cache was cold)") == 1
    assert not [n for n in (tmp_path / "root" / "caches").iterdir() if n.name.startswith(".")]
    p = cli(["cache", "clear", "box", "-p", "fast"], env, check=True)
    assert "warning" not in p.stderr.decode()


# ---- a supervisor killed during a snapshot or a restore ----------------------------

def kill_supervisor_when(state_path: Path, pred, timeout: float = 60) -> dict:
    """SIGKILL the job's supervisor the moment ``pred(state)`` holds (polled every 2 ms)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            st = json.loads(state_path.read_text())
        except (OSError, ValueError):
            st = {}
        if st and pred(st):
            os.kill(st["supervisor_pid"], signal.SIGKILL)
            return st
        time.sleep(0.002)
    raise AssertionError("the moment to kill never came")


def whole(path: Path, files: int) -> bool:
    return sum(1 for sub in ("inductor", "triton", "torch_extensions")
               for _ in (path / sub).iterdir()) == files if (path / "inductor").exists() else False


def test_a_supervisor_killed_mid_snapshot_or_mid_restore_leaves_old_or_whole_new(tmp_path):
    env = make_env(tmp_path)
    spec = setup(tmp_path, warmup="python warmup.py --many 3000")
    root = tmp_path / "root"
    # killed while it snapshots: the next supervisor takes the snapshot; the trainer is not rerun
    first = job_id_of(cli(["submit", str(spec)], env, check=True).stdout)
    st = kill_supervisor_when(root / "jobs" / first / "state.json", lambda st: st.get("snapshot_due"))
    key = st["env_key"]
    ls = cli_json(["cache", "ls", "box", "--json"], env)  # looks (and recovers) first
    snaps = ls["caches"][0]["snapshots"]
    assert snaps == [] or snaps[0]["files"] == 9000, snaps
    assert not list((root / "snapshots" / key).glob(".*"))
    cli(["status", first], env, check=True)  # revives the supervisor
    wait_for(lambda: json.loads((root / "jobs" / first / "state.json").read_text())["state"] == "succeeded",
             60, what="the revived supervisor to finish")
    log = (root / "jobs" / first / "job.log").read_text()
    assert log.count("kernels found") == 1  # the trainer ran once
    ev = events(root / "jobs" / first)
    # taken by the next supervisor (or again, when the kill came after it but before state said so)
    assert [e["type"] for e in ev].count("cache_snapshot") == (1 if snaps == [] else 2), \
        (snaps, [e for e in ev if e["type"].startswith(("cache", "supervisor"))])
    assert len(cli_json(["cache", "ls", "box", "--json"], env)["caches"][0]["snapshots"]) == 1
    entry = ledger(tmp_path)
    assert entry["status"] == "good" and entry["snapshot"]["files"] == 9000

    # killed while it restores: afterwards no cache or the whole one; the next supervisor restores
    cli(["cache", "clear", "box", "-p", "fast"], env, check=True)
    second = job_id_of(cli(["submit", str(spec)], env, check=True).stdout)
    kill_supervisor_when(root / "jobs" / second / "state.json", lambda st: st.get("step") == "restore")
    time.sleep(0.05)
    cli_json(["cache", "ls", "box", "--json"], env)
    live = root / "caches" / key
    assert not live.exists() or whole(live, 9000), sorted(os.listdir(live))
    assert not [n for n in os.listdir(root / "caches") if n.startswith(".")]
    cli(["status", second], env, check=True)
    wait_for(lambda: json.loads((root / "jobs" / second / "state.json").read_text())["state"] == "succeeded",
             60, what="the revived supervisor to finish")
    log = (root / "jobs" / second / "job.log").read_text()
    assert found(log) == f"found: compiled by {first}" and "kernel files: 3000" in log
    assert whole(live, 9000)


def test_a_rollback_onto_a_known_good_profile_restores_its_cleared_cache(tmp_path):
    env = make_env(tmp_path)
    spec = setup(tmp_path)
    data = yaml.safe_load(spec.read_text())
    data["profiles"].append({"name": "broken", "system_site_packages": True, "env": {"BREAK": "1"}})
    spec.write_text(yaml.safe_dump(data, sort_keys=False))
    first, _log, _ev = run_job(spec, env)  # fast: known-good, snapshot
    cli(["cache", "clear", "box", "-p", "fast"], env, check=True)
    second, log, ev = run_job(spec, env, "--profile", "broken")
    kinds = [e["type"] for e in ev]
    assert "rollback" in kinds and "cold_retry" not in kinds  # broken has no snapshot: judged at once
    restored = [e for e in ev if e["type"] == "cache_restored"]
    assert len(restored) == 1 and restored[0]["profile"] == "fast"
    assert kinds.index("rollback") < kinds.index("cache_restored")
    assert found(log.split("ROLLBACK")[1]) == f"found: compiled by {first}"
