"""Real wheels, measured (issue 15, part 8): two profiles holding real torch builds,
built by gpujob (uv) into a local container home on the `local` target.

    python -m bench.wheels --out wheels.json
        [--index file:///opt/pypi/simple] [--extra-index file:///opt/pypi-more/simple]
        [--find-links file:///opt/wheels] [--drop-caches]
        [--profile a=torch==2.13.0+cpu,numpy==1.26.0 --profile b=torch==2.13.0+cpu,numpy==2.4.1]

The defaults are this CI machine's local mirror of the package registry (the
indexes and the folder of wheels that pip's config names; uv does not read pip's
config, so the profiles name them). Builds, in this order, each one a `gpujob
submit` until the trainer runs:

  1. a, cold: uv's cache empty
  2. b, cold: a's venv and uv's cache removed first
  3. b again from uv's cache (its venv removed, the cache kept)
  4. a with b's files in the cache: only what a does not share with b is prepared
  5. a again from uv's cache (its venv removed)

For each: gpujob's env_ready seconds (venv + install + the verify step, which
imports torch), uv's own split of the pins step from job.log (resolve; prepare =
fetch the wheel and unpack it into the cache, what a download would add to; install =
link from the cache into the venv), and the bytes of the wheel files prepared.
With --drop-caches the page cache is dropped before each cold build, and after
each build that prepared wheels the same wheel files are read once more from a
dropped page cache (``read_wheels_cold_s``: what fetching them from the local
mirror costs alone; there is no network here). Then the disk of both venvs
together, apparent (`du -l --apparent-size`: every hard link counted, as if each
venv had its own copy) vs real (`du`, each hard-linked file counted once), with
and without uv's cache, and
what `gpujob profiles` says; then the switch time: a manual rollback of a running
job from a to the installed b (decision -> trainer start -> first sample) and a
resubmit onto the installed a (submit -> first sample). Run it once, outside CI.
Every figure goes to the JSON as soon as it is measured.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
# A real (small) torch workload: one thread, a 256x256 matmul chain per step.
TRAINER = """\
import sys, time
t0 = time.time()
import numpy, torch
torch.set_num_threads(1)
print(f"torch {torch.__version__} numpy {numpy.__version__} imported in {time.time() - t0:.2f}s", flush=True)
x = torch.from_numpy(numpy.random.rand(256, 256).astype("float32"))
for i in range(100000):
    t = time.time()
    y = x
    for _ in range(20):
        y = torch.tanh(y @ x)
    time.sleep(0.1)
    print(f"step {i} | {20 * 256 / (time.time() - t):.0f} tok/s", flush=True)
"""
UV_LINE = re.compile(r"^(Resolved|Prepared|Installed|Audited|Checked|Uninstalled) (\d+) packages? in "
                     r"([\d.]+)(ms|s)\b")
ADDED = re.compile(r"^ \+ (\S+)==(\S+)$")


def uv_steps(log: str) -> list:
    """uv's summary lines of each `uv pip install` in a job.log, in order."""
    steps, cur = [], None
    for line in log.splitlines():
        if "] $ " in line and " pip install " in line:  # the supervisor's "[gpujob HH:MM:SS] $ argv"
            cur = {"argv": line.split("] $ ", 1)[1], "added": []}
            steps.append(cur)
        elif cur is not None:
            m = UV_LINE.match(line.strip())
            if m:
                scale = 1000 if m.group(4) == "ms" else 1
                cur[m.group(1).lower() + "_s"] = round(float(m.group(3)) / scale, 3)
                cur[m.group(1).lower() + "_n"] = int(m.group(2))
            m = ADDED.match(line.rstrip())
            if m:
                cur["added"].append(f"{m.group(1)}=={m.group(2)}")
    return steps


def wheel_file(dirs: list, req: str) -> Path | None:
    name, version = req.split("==")
    stem = f"{re.sub(r'[-_.]+', '_', name).lower()}-{version}-"
    for d in dirs:
        for f in sorted(Path(d).glob("*.whl")) if Path(d).is_dir() else []:
            if f.name.lower().startswith(stem.lower()):
                return f
    return None


def du(paths: list, apparent: bool) -> int:
    """Bytes of the paths together (du -s -c). Apparent: the sum of file sizes with
    every hard link counted (-l), as if each venv had its own copy; real: the blocks
    used, each hard-linked file counted once."""
    flag = ["--apparent-size", "-l"] if apparent else []
    r = subprocess.run(["du", "-s", "-c", "-B1", *flag, *map(str, paths)], capture_output=True, text=True,
                       check=True)
    return int(r.stdout.strip().splitlines()[-1].split()[0])


def drop_page_cache() -> bool:
    """So that a cold build reads the wheels from disk (needs root; best effort)."""
    try:
        os.sync()
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        return True
    except OSError:
        return False


def uv_bin() -> str:
    import uv
    return uv.find_uv_bin()


def network_probe(tmp: Path, uv: str, pin: str, indexes: dict) -> dict:
    """One wheel, no dependencies, into an empty uv cache and a fresh venv: uv's
    'Prepared' time from the local mirror and from the network index."""
    out = {"pin": pin}
    for where, urls in indexes.items():
        d = tmp / f"probe-{where}"
        subprocess.run([uv, "venv", "-q", "--python", sys.executable, str(d / "v")], check=True)
        idx = ["--index-url", urls[0], *(a for u in urls[1:] for a in ("--extra-index-url", u))]
        drop_page_cache()
        t = time.time()
        r = subprocess.run([uv, "pip", "install", "--python", str(d / "v" / "bin" / "python"), "--cache-dir",
                            str(d / "cache"), "--no-deps", *idx, pin], capture_output=True, text=True)
        wall = round(time.time() - t, 3)
        steps = uv_steps("[probe] $ uv pip install " + pin + "\n" + r.stderr + r.stdout)
        out[where] = dict({k: v for k, v in steps[0].items() if k != "argv"}, wall_s=wall, rc=r.returncode,
                          index=urls[0])
        if r.returncode:
            out[where]["error"] = (r.stderr or r.stdout)[-500:]
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.wheels")
    p.add_argument("--out", default="bench-wheels.json")
    p.add_argument("--index", default="file:///opt/pypi/simple")
    p.add_argument("--extra-index", action="append", default=None,
                   help="default: file:///opt/pypi-more/simple")
    p.add_argument("--find-links", action="append", default=None, help="default: file:///opt/wheels")
    p.add_argument("--profile", action="append", default=None, metavar="NAME=PIN[,PIN...]",
                   help="exactly two; default a=torch==2.13.0+cpu,numpy==1.26.0 "
                        "b=torch==2.13.0+cpu,numpy==2.4.1")
    p.add_argument("--wheel-dir", action="append", default=None,
                   help="where the wheel files lie, to report their bytes (default: the find-links "
                        "folders and each file index's ../files)")
    p.add_argument("--drop-caches", action="store_true", help="drop the page cache before each cold build")
    p.add_argument("--network-index", default=None, metavar="URL",
                   help="also time one wheel (--network-pin) fetched from this index over the network "
                        "against the same wheel from --index, each into an empty uv cache")
    p.add_argument("--network-pin", default="numpy==2.4.1")
    args = p.parse_args(argv)
    extra = args.extra_index if args.extra_index is not None else ["file:///opt/pypi-more/simple"]
    links = args.find_links if args.find_links is not None else ["file:///opt/wheels"]
    profs = args.profile or ["a=torch==2.13.0+cpu,numpy==1.26.0", "b=torch==2.13.0+cpu,numpy==2.4.1"]
    if len(profs) != 2:
        p.error("give --profile exactly twice")
    pins = {n: v.split(",") for n, v in (x.split("=", 1) for x in profs)}
    a, b = pins
    local = [u[len("file://"):] for u in [args.index, *extra] if u.startswith("file://")]
    wheel_dirs = args.wheel_dir or [u[len("file://"):] for u in links if u.startswith("file://")] + \
        [str(Path(d).parent / "files") for d in local]

    tmp = Path(tempfile.mkdtemp(prefix="gpujob-bench-wheels-"))
    uv = subprocess.run([sys.executable, "-c",
                         "import uv, subprocess; subprocess.run([uv.find_uv_bin(), '--version'])"],
                        capture_output=True, text=True).stdout.strip()
    fig: dict = {"status": "running", "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                 "machine": {"nproc": os.cpu_count(), "uname": " ".join(platform.uname()),
                             "python": platform.python_version(), "uv": uv},
                 "index": args.index, "extra_index_urls": extra, "find_links": links, "profiles": pins}

    def save(**kw):
        fig.update(kw)
        Path(args.out).write_text(json.dumps(fig, indent=2))
    root = tmp / "root"
    (tmp / "code").mkdir()
    (tmp / "code" / "trainer.py").write_text(TRAINER)
    hosts = tmp / "hosts.yaml"
    hosts.write_text(yaml.safe_dump({"hosts": {"lab": {"kind": "local",
                                                       "containers": {"box": {"root": str(root)}}}}}))
    env = dict(os.environ, GPUJOB_HOSTS=str(hosts), XDG_STATE_HOME=str(tmp / "state"), COLUMNS="160")
    spec = {"name": "wheels", "target": "box", "sync": [{"src": str(tmp / "code"), "dest": "."}],
            "profiles": [{"name": n, "index_url": args.index, "extra_index_urls": extra, "find_links": links,
                          "packages": v} for n, v in pins.items()],
            "throughput": {"format": "ktok", "min": 1},
            "train": {"command": "python trainer.py", "grace": "5s"}}
    path = tmp / "job.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))

    def cli(*a, timeout=1800, check=True):
        r = subprocess.run([sys.executable, "-m", "gpujob.cli.main", *a], env=env, cwd=REPO,
                           capture_output=True, text=True, timeout=timeout)
        if check and r.returncode != 0:
            raise SystemExit(f"bench.wheels: gpujob {' '.join(a)} failed: {r.stdout[-800:]} "
                             f"{r.stderr[-800:]}")
        return r

    def first_sample(job: str, timeout: float = 120) -> float | None:
        f = root / "jobs" / job / "samples.jsonl"
        end = time.time() + timeout
        while time.time() < end:
            if f.exists() and f.read_text().strip():
                return json.loads(f.read_text().splitlines()[0])["t"]
            time.sleep(0.05)
        return None

    def submit(profile: str) -> tuple:
        """Submit, wait for the trainer's first sample; (job id, seconds from submit to it)."""
        t0 = time.time()
        r = cli("submit", str(path), "--profile", profile, "--force")
        job = re.search(r"^submitted (\S+) ", r.stdout, re.M).group(1)
        for _ in range(7200):
            st = json.loads(cli("status", job, "--json").stdout)
            if st["state"] in ("training", "failed", "succeeded", "stopped"):
                break
            time.sleep(0.25)
        if st["state"] != "training":
            log = (root / "jobs" / job / "job.log").read_text()[-3000:]
            raise SystemExit(f"bench.wheels: {job} ended {st['state']}: {st.get('reason')}\n{log}")
        t1 = first_sample(job)
        return job, (round(t1 - t0, 2) if t1 else None)

    def build(profile: str, what: str) -> dict:
        job, to_sample = submit(profile)
        cli("stop", job)
        ev = [json.loads(x) for x in (root / "jobs" / job / "events.jsonl").read_text().splitlines()]
        ready = [e for e in ev if e["type"] == "env_ready"]
        steps = uv_steps((root / "jobs" / job / "job.log").read_text())
        pin = steps[0] if steps else {}
        # uv names what it installed, not what it prepared: the prepared ones are those
        # not yet in uv's cache (checked against uv's count below)
        prepared = [r for r in pin.get("added", []) if r not in in_cache] if pin.get("prepared_n") else []
        in_cache.update(pin.get("added", []))
        files = {r: wheel_file(wheel_dirs, r) for r in prepared}
        rec = {"what": what, "job": job, "env_ready_s": ready[-1]["seconds"] if ready else None,
               "submit_to_first_sample_s": to_sample,
               "uv": {k: v for k, v in pin.items() if k not in ("argv",)},
               "packages": ready[-1].get("packages") if ready else None}
        if prepared:
            rec["prepared"] = prepared
            if len(prepared) != pin.get("prepared_n"):
                rec["prepared_count_mismatch"] = (f"uv prepared {pin.get('prepared_n')}, we expected "
                                                  f"{len(prepared)}")
            rec["prepared_wheel_bytes"] = sum(f.stat().st_size for f in files.values() if f)
            rec["prepared_wheels_not_found"] = [r for r, f in files.items() if not f]
            if args.drop_caches and drop_page_cache():  # what fetching them from the local mirror costs alone
                t = time.time()
                for f in files.values():
                    if f:
                        with open(f, "rb") as fh:
                            while fh.read(1 << 20):
                                pass
                rec["read_wheels_cold_s"] = round(time.time() - t, 3)
        return rec

    def venv_of(profile: str) -> Path:
        return next((root / "envs").glob(f"{profile}-*"))

    def cold(profile: str, what: str) -> dict:
        dropped = drop_page_cache() if args.drop_caches else None
        rec = build(profile, what)
        if dropped is not None:
            rec["page_cache_dropped"] = dropped
        return rec

    in_cache: set = set()
    try:
        builds = []
        builds.append(cold(a, f"{a}, cold (empty uv cache)"))
        save(builds=builds)
        shutil.rmtree(venv_of(a))
        shutil.rmtree(root / "uv-cache")
        in_cache.clear()
        builds.append(cold(b, f"{b}, cold (empty uv cache, {a}'s venv removed)"))
        save(builds=builds)
        shutil.rmtree(venv_of(b))
        builds.append(build(b, f"{b}, from uv's cache (venv removed)"))
        save(builds=builds)
        builds.append(build(a, f"{a}, with {b}'s files in uv's cache"))
        save(builds=builds)
        shutil.rmtree(venv_of(a))
        builds.append(build(a, f"{a}, from uv's cache (venv removed)"))
        save(builds=builds)

        venvs = [venv_of(a), venv_of(b)]
        cache = root / "uv-cache"
        prof = json.loads(cli("profiles", "box", "--json").stdout)
        save(disk={
            "du_venvs": {v.name: {"apparent": du([v], True), "real": du([v], False)} for v in venvs},
            "du_both_venvs": {"apparent": du(venvs, True), "real": du(venvs, False)},
            "du_uv_cache": {"apparent": du([cache], True), "real": du([cache], False)},
            "du_both_venvs_and_uv_cache": {"apparent": du(venvs + [cache], True),
                                           "real": du(venvs + [cache], False)},
            "gpujob_profiles": {e["profile"]: e["disk"] for e in prof["envs"]},
            "gpujob_profiles_total": prof["disk_total"]})

        job, _ = submit(a)
        time.sleep(3)
        cli("rollback", job, "--to", b)
        rb = {}
        for _ in range(1200):
            st = json.loads(cli("status", job, "--json").stdout)
            rb = (st.get("rollbacks") or [{}])[-1]
            if "first_sample" in (rb.get("timings") or {}):
                break
            time.sleep(0.1)
        cli("stop", job)
        imports = re.findall(r"imported in ([\d.]+)s", (root / "jobs" / job / "job.log").read_text())
        job2, to_sample = submit(a)
        ev = [json.loads(x)["type"] for x in (root / "jobs" / job2 / "events.jsonl").read_text().splitlines()]
        cli("stop", job2)
        save(switch={"rollback_to_installed": {"job": job, "took_s": rb.get("took"),
                                               "timings": rb.get("timings"),
                                               "trainer_import_torch_numpy_s": float(imports[-1]) if imports
                                               else None},
                     "resubmit_onto_installed": {"job": job2, "submit_to_first_sample_s": to_sample,
                                                 "env_reused": "env_reused" in ev}},
             status="done" if not args.network_index else "running")
        if args.network_index:
            save(network=network_probe(tmp, uv_bin(), args.network_pin,
                                       {"local": [args.index, *extra], "network": [args.network_index]}),
                 status="done")
    finally:
        if fig.get("status") != "done":
            save(status="failed")
        shutil.rmtree(tmp, ignore_errors=True)
    print(json.dumps(fig, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
