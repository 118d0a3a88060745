"""`gpujob bisect` and `gpujob tune` on the bed: ssh -> pct -> a real LXC container, venvs
built by uv from a real package index on loopback holding five packages (bis-a .. bis-e) in
two versions each; a stand-in trainer (tests/data/bisect/trainer.py) whose speed they decide.
One package's new version slows it (and, in a second index, only two packages together):
bisect names the culprit within its bound; tune ranks three profiles right; the job's own
ledger and workdir are not changed by a trial."""

from __future__ import annotations

import hashlib
import json
import math
import os
from pathlib import Path

import pytest
import yaml

import subprocess

from helpers import cli, cli_json, gpujob_argv, user_env, wait_for
from test_jobs_testbed import bed_env, home_path, status  # noqa: F401 (bed_env: a fixture)

pytestmark = pytest.mark.testbed

HERE = Path(__file__).resolve().parents[1]  # tests/ (this file is in tests/bed)
PACKAGES = "abcde"


def with_requires(wheel: Path, requires: str) -> Path:
    """The wheel with ``Requires-Dist: requires`` in its METADATA (its RECORD rewritten)."""
    import base64
    import io
    import zipfile
    with zipfile.ZipFile(wheel) as z:
        files = {n: z.read(n) for n in z.namelist()}
    meta = next(n for n in files if n.endswith(".dist-info/METADATA"))
    files[meta] += f"Requires-Dist: {requires}\n".encode()
    record = next(n for n in files if n.endswith(".dist-info/RECORD"))
    files[record] = "".join(
        f"{n},sha256={base64.urlsafe_b64encode(hashlib.sha256(d).digest()).rstrip(b'=').decode()},{len(d)}\n"
        for n, d in files.items() if n != record).encode() + f"{record},,\n".encode()
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        for n, d in files.items():
            z.writestr(zipfile.ZipInfo(n, date_time=(2020, 1, 1, 0, 0, 0)), d)
    wheel.write_bytes(buf.getvalue())
    return wheel


def write_index(root: Path, bodies: dict, requires: dict | None = None) -> None:
    """A PEP 503 index under ``root/simple``: {(letter, version): module body}; ``requires``:
    {(letter, version): a requirement its wheel declares}."""
    from gpujob.ops.wheelhouse import build_wheel
    for (letter, version), body in bodies.items():
        pkg = f"bis-{letter}"
        wheel = build_wheel(root / "wheels", "", 0.0, version, package=pkg, module=f"bis_{letter}", body=body)
        if (requires or {}).get((letter, version)):
            with_requires(wheel, requires[(letter, version)])
        digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
        proj = root / "simple" / pkg
        proj.mkdir(parents=True, exist_ok=True)
        page = proj / "index.html"
        links = page.read_text() if page.exists() else ""
        page.write_text(links + f'<a href="../../wheels/{wheel.name}#sha256={digest}">{wheel.name}</a>\n')


@pytest.fixture(scope="module")
def bis_index(tmp_path_factory):
    """Three indexes on loopback HTTP: ``single`` (bis-c 2.0 runs at 0.4x), ``pair`` (bis-b
    2.0 and bis-d 2.0 halve it only together) and ``tied`` (bis-b 2.0 is slow and needs bis-d
    2.0: a subset with one and not the other does not resolve)."""
    from gpujob.ops.wheelhouse import serve
    root = tmp_path_factory.mktemp("bisindex")
    for case, body in (("single", {"c": "FACTOR = 0.4\n"}),
                       ("pair", {"b": "PAIR = True\n", "d": "PAIR = True\n"})):
        write_index(root / case, {(x, v): (body.get(x, "") if v == "2.0" else "")
                                  for x in PACKAGES for v in ("1.0", "2.0")})
    # tied: bis-b 2.0 is slow and needs bis-d 2.0 (as a torch needs its triton)
    write_index(root / "tied", {(x, v): ("FACTOR = 0.4\n" if (x, v) == ("b", "2.0") else "")
                                for x in PACKAGES for v in ("1.0", "2.0")}, {("b", "2.0"): "bis-d==2.0"})
    server, url = serve(root)
    yield {case: f"{url}/{case}/simple" for case in ("single", "pair", "tied")}
    server.shutdown()


def spec_of(tmp_path: Path, url: str, profiles: dict, steps: int = 600) -> Path:
    """``profiles``: {name: ({letter: version}, env)}."""
    spec = {
        "name": "bis", "target": "ct200",
        "sync": [{"src": str(HERE / "data" / "bisect"), "dest": "."}],
        "profiles": [{"name": n, "index_url": url, "env": env,
                      "packages": [f"bis-{x}=={v}" for x, v in sorted(pins.items())]}
                     for n, (pins, env) in profiles.items()],
        "train": {"command": f"python trainer.py --steps {steps} --interval 0.04",
                  "resume_args": ["--resume"], "checkpoint": {"path": "ckpt/state.json", "every": "1s"}},
        "throughput": {"format": "ktok", "window": 3, "min": "1K", "no_data_timeout": "60s"},
    }
    path = tmp_path / "bis.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


OLD = {x: "1.0" for x in PACKAGES}
NEW = {x: "2.0" for x in PACKAGES}


def ledger(env, name="bis") -> dict:
    return cli_json(["ledger", "history", "ct200", name, "--json"], env)


@pytest.mark.parametrize("case, culprit", [("single", ["bis-c 1.0 -> 2.0"]),
                                           ("pair", ["bis-b 1.0 -> 2.0", "bis-d 1.0 -> 2.0"])])
def test_bisect_names_the_culprit_within_its_bound(testbed, bed_env, tmp_path, bis_index, case, culprit):
    env = bed_env
    spec = spec_of(tmp_path, bis_index[case], {"old": (OLD, {}), "new": (NEW, {"BIS_HARMLESS": "1"})})
    plan = cli(["bisect", str(spec), "--good", "old", "--bad", "new", "--plan"], env,
               check=True).stdout.decode()
    assert "6 changes" in plan and "env BIS_HARMLESS (none) -> 1" in plan and "uv" in plan
    assert not home_path(testbed, env, "jobs").exists()  # the plan runs nothing
    p = cli(["bisect", str(spec), "--good", "old", "--bad", "new", "--trial-time", "20s", "--json",
             "--apply"],
            env, timeout=900)
    assert p.returncode == 0, p.stderr.decode()[-3000:]
    res = json.loads(p.stdout)
    assert res["culprit"] == culprit, res
    n = len(res["trials"])
    bound = math.ceil(math.log2(6)) + 2 if case == "single" else 2 * math.ceil(math.log2(6)) + 4
    assert n <= bound, res["trials"]
    assert res["answer"].startswith("slow with: " + " + ".join(culprit)), res["answer"]
    assert res["trials"][0]["verdict"] == "ok" and res["trials"][0]["label"] == "good (old)"
    assert all(t["median"] for t in res["trials"]), res["trials"]
    # the trials ran as jobs of their own: the job's name has no workdir; the answer is in its ledger
    assert not home_path(testbed, env, "work", "bis").exists()
    assert home_path(testbed, env, "work", "bis-bisect").is_dir()
    [rec] = ledger(env)["history"]
    assert rec["profile"] == "new" and rec["status"] == "bad" and rec["reason"] == "bisect: " + res["answer"]
    # the good set was built once: each trial's venv is named by its content
    envs = os.listdir(home_path(testbed, env, "envs"))
    assert sum(e.startswith("old-") for e in envs) == 1
    assert len([e for e in envs if e.startswith("t-")]) == n - 1  # each subset tried once (the bad: "new-")
    # gc removes the trial venvs as any unused one: no trial is ever known-good in a ledger
    cli(["gc", "ct200", "--days", "0"], env, check=True)
    assert not [e for e in os.listdir(home_path(testbed, env, "envs")) if e.startswith("t-")]


def test_tune_ranks_three_profiles_and_apply_makes_the_winner_known_good(testbed, bed_env, tmp_path,
                                                                         bis_index):
    env = bed_env
    spec = spec_of(tmp_path, bis_index["single"], {
        "slowest": (dict(OLD, c="2.0"), {}), "fast": (OLD, {}), "also-fast": (dict(OLD, a="2.0"), {})})
    p = cli(["tune", str(spec), "-p", "slowest", "-p", "fast", "-p", "also-fast", "--trial-time", "20s",
             "--json"],
            env, timeout=900)
    assert p.returncode == 0, p.stderr.decode()[-3000:]
    ranked = json.loads(p.stdout)["ranked"]
    assert ranked[-1]["profile"] == "slowest" and {r["profile"] for r in ranked[:2]} == {"fast", "also-fast"}
    assert ranked[0]["median"] > 2 * ranked[-1]["median"]
    assert ledger(env)["history"] == []  # without --apply: nothing recorded
    p = cli(["tune", str(spec), "-p", "slowest", "-p", "fast", "--trial-time", "20s", "--apply"], env,
            timeout=900)
    assert p.returncode == 0, p.stderr.decode()[-3000:]
    assert "fastest: fast" in p.stdout.decode()
    progress = p.stderr.decode()
    assert "trial 1 (bis-bisect-" in progress and ": slowest: measuring, " in progress, progress
    assert ": fast: measuring, " in progress and "tok/s" in progress, progress
    [rec] = ledger(env)["history"]
    assert rec["profile"] == "fast" and rec["status"] == "good" and "slowest" in rec["reason"]


def test_controller_killed_mid_trial_the_trial_ends_on_its_own_and_the_job_is_untouched(
        testbed, bed_env, tmp_path, bis_index):
    env = bed_env
    spec = spec_of(tmp_path, bis_index["single"], {"old": (OLD, {}), "new": (dict(OLD, c="2.0"), {})})
    cli(["ledger", "set", "ct200", "bis", "old", "good"], env, check=True)
    cli(["ledger", "set", "ct200", "bis", "new", "bad"], env, check=True)
    before = ledger(env)
    # defaults: --good is the ledger's known-good, --bad the profile it marked bad last
    proc = subprocess.Popen([*gpujob_argv(), "bisect", str(spec), "--trial-time", "4s", "--slower", "0.99"],
                            env=user_env(env), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    seen = b""
    while b"measuring" not in seen:
        line = proc.stderr.readline()
        assert line, seen.decode()
        seen += line
    assert b"good (old): measuring" in seen
    proc.kill()  # kill -9 of the controller while the trial measures
    proc.wait()
    [job_id] = os.listdir(home_path(testbed, env, "jobs"))
    st = wait_for(lambda: (s := status(job_id, env))["state"] in ("failed", "succeeded", "stopped") and s,
                  60, what="the orphaned trial to end on its own")
    assert "timed out" in st["reason"]
    assert ledger(env) == before  # the job's ledger: not a byte changed
    assert not home_path(testbed, env, "work", "bis").exists()
    # the container is free again: the next bisect runs and answers
    p = cli(["bisect", str(spec), "--trial-time", "20s"], env, timeout=600)
    assert p.returncode == 0, p.stderr.decode()[-3000:]
    assert "slow with: bis-c 1.0 -> 2.0; 0.40x of good" in p.stdout.decode()
    assert ledger(env) == before  # no --apply: nothing recorded


def test_a_running_job_is_never_touched_the_trial_is_refused(testbed, bed_env, tmp_path, bis_index):
    env = bed_env
    spec = spec_of(tmp_path, bis_index["single"], {"old": (OLD, {}), "new": (dict(OLD, c="2.0"), {})})
    job = cli(["submit", str(spec), "--profile", "old"], env, check=True)
    job_id = job.stdout.decode().split()[1]
    wait_for(lambda: status(job_id, env)["state"] == "training", 60, what="the job to train")
    p = cli(["bisect", str(spec), "--good", "old", "--bad", "new", "--trial-time", "5s"], env)
    assert p.returncode == 5 and "container busy" in p.stderr.decode(), p.stderr.decode()
    assert status(job_id, env)["state"] == "training"
    assert not home_path(testbed, env, "work", "bis-bisect").exists()
    assert os.listdir(home_path(testbed, env, "jobs")) == [job_id]  # no trial's job directory
    # nor a trial in the index
    assert "bis-bisect-" not in cli(["ps", "--json"], env, check=True).stdout.decode()
    cli(["stop", job_id], env, check=True)


def test_a_change_that_does_not_resolve_alone_moves_with_its_neighbour(testbed, bed_env, tmp_path, bis_index):
    env = bed_env
    spec = spec_of(tmp_path, bis_index["tied"], {"old": (OLD, {}), "new": (NEW, {})})
    p = cli(["bisect", str(spec), "--good", "old", "--bad", "new", "--trial-time", "20s", "--json"], env,
            timeout=900)
    assert p.returncode == 0, p.stderr.decode()[-3000:]
    res = json.loads(p.stdout)
    assert res["culprit"] == ["bis-b 1.0 -> 2.0 (moves with bis-d 1.0 -> 2.0)"], res
    unresolved = [t for t in res["trials"] if t["verdict"] == "unresolved"]
    assert unresolved and all("installing profile" in t["reason"] for t in unresolved), res["trials"]
    assert res["answer"].startswith("slow with: bis-b 1.0 -> 2.0 (moves with bis-d 1.0 -> 2.0); "
                                    "0.40x of good"), res["answer"]


def test_trials_start_from_a_copy_of_the_jobs_newest_checkpoint_and_never_touch_it(
        testbed, bed_env, tmp_path, bis_index):
    env = bed_env
    first = spec_of(tmp_path, bis_index["single"], {"old": (OLD, {}), "new": (dict(OLD, c="2.0"), {})},
                    steps=30)
    job = cli(["submit", str(first), "--profile", "old", "--follow"], env, timeout=300)
    assert job.returncode == 0, job.stderr.decode()[-2000:]
    job_id = job.stdout.decode().split("submitted ")[1].split()[0]
    ckpt = home_path(testbed, env, "work", "bis", "ckpt", "state.json")
    assert json.loads(ckpt.read_text()) == {"step": 30}
    before = (ckpt.read_bytes(), ckpt.stat().st_mtime_ns)
    spec = spec_of(tmp_path, bis_index["single"], {"old": (OLD, {}), "new": (dict(OLD, c="2.0"), {})},
                   steps=900)
    p = cli(["tune", str(spec), "-p", "new", "-p", "old", "--from", job_id, "--trial-time", "20s", "--json"],
            env, timeout=600)
    assert p.returncode == 0, p.stderr.decode()[-3000:]
    ranked = json.loads(p.stdout)["ranked"]
    assert [r["profile"] for r in ranked] == ["old", "new"]
    copy = home_path(testbed, env, "work", "bis-bisect", "ckpt", "state.json")
    for r in ranked:  # each trial resumed from the same start: the job's step 30, copied into its own workdir
        log = home_path(testbed, env, "jobs", r["job_id"], "train.log").read_text()
        assert "resumed at step 30 from " in log, log[:500]
        assert "bis-bisect/ckpt/state.json" in log.split("resumed at step 30 from ")[1].splitlines()[0]
    assert (ckpt.read_bytes(), ckpt.stat().st_mtime_ns) == before  # the job's checkpoint: not a byte changed
    assert json.loads(copy.read_text())["step"] > 30  # the trial trained on from its copy
