"""The figures of a job: an unchanged resubmit against a first submit, the 1000 lines/s job
(``logs -f`` latency, the supervisor's CPU and memory), a bulk log read, and a rollback with
its venv prebuilt against one reinstalled."""

from __future__ import annotations

import subprocess
import threading
import time

from bench.harness import FINAL, HOME, Harness
from bench.report import Figure, median, percentile
from gpujob.ops.follow import follow_log


def resubmit(h: Harness) -> None:
    spec = h.write_spec("resubmit.yaml", profile="fast", trainer="--lines 40 --rate 25")
    first, again = [], []
    for _ in range(h.sizes.reps):
        # a first submit: nothing of gpujob's in the container but the job ledger
        for p in (f"{HOME}/bin", f"{HOME}/envs/fast-*", f"{HOME}/caches/fast-*", f"{HOME}/uv-cache",
                  f"{HOME}/work/bench"):
            h.remove(p)
        job, t0 = h.submit(spec)
        h.succeeded(job, "fast")
        first.append(h.train_at(job) - t0)
        job, t0 = h.submit(spec)
        h.succeeded(job, "fast")
        ev = h.events(job)
        if any(e["type"] == "env_build" for e in ev) or not any(e["type"] == "warmup_skipped" for e in ev):
            raise RuntimeError(f"resubmit {job} rebuilt its venv or ran its warmup")
        again.append(h.train_at(job) - t0)
    o, b = median(again), median(first)
    h.add(Figure("resubmit", "resubmit, unchanged profile: submit → train", "s", "≤ 3 s",
                    o, b, b / o, o <= 3, {"resubmit_s": again, "first_submit_s": first},
                    "from the start of the `gpujob submit` process to the supervisor's "
                    "`phase: train` event; first submit = agent, uv, code, venv, uv cache and "
                    "compile cache all absent (uv shipped, venv built, warmup run)"))


def stream(h: Harness) -> str:
    """The 1000 lines/s job: write→print latency and the supervisor's overhead."""
    rate, secs = h.sizes.rate, h.sizes.seconds
    spec = h.write_spec("stream.yaml", profile="fast",
                           trainer=f"--rate {rate:g} --seconds {secs:g} --tps-every 10")
    job, _ = h.submit(spec)
    started = time.time()
    lat: list[float] = []
    buf = bytearray()
    count = [0]

    def write(chunk: bytes) -> None:
        now = time.time()
        buf.extend(chunk)
        *lines, rest = bytes(buf).split(b"\n")
        buf[:] = rest
        for ln in lines:
            try:
                ts = float(ln[:ln.index(b" ")])
            except ValueError:
                continue  # gpujob's banner lines, warmup output
            count[0] += 1
            if ts >= started + 1.0:  # steady state: not what was printed before we followed
                lat.append(now - ts)

    samples: list[dict] = []
    err: list[BaseException] = []

    def sample() -> None:
        try:
            end = time.monotonic() + 120
            while time.monotonic() < end:
                st = h.state(job)
                if st.get("phase") == "train" and st.get("child_pid"):
                    break
                if st.get("state") in FINAL:
                    raise RuntimeError(f"job {job} ended before training: {st.get('reason')}")
                time.sleep(0.05)
            t_train = time.monotonic()
            pid = h.state(job)["supervisor_pid"]
            time.sleep(min(1.0, secs / 4))
            samples.append(h.proc(pid))
            time.sleep(max(0.5, t_train + secs - 0.5 - time.monotonic()))
            samples.append(h.proc(pid))
        except BaseException as e:  # noqa: BLE001 - reported by the main thread
            err.append(e)

    th = threading.Thread(target=sample, daemon=True)
    th.start()
    follow_log(h.target, job, write=write, notice=lambda m: h.log(f"follow: {m}"))
    th.join(30)
    h.succeeded(job, "fast")
    if err:
        raise err[0]
    if len(samples) != 2 or not lat:
        raise RuntimeError(f"no measurement (samples {len(samples)}, {len(lat)} latencies)")
    a, b = samples
    cpu = (b["cpu"] - a["cpu"]) / (b["t"] - a["t"]) * 100
    rss = max(b["hwm_kb"] or 0, b["rss_kb"] or 0) / 1024
    lat_ms = [x * 1000 for x in lat]
    p50, p99 = percentile(lat_ms, 50), percentile(lat_ms, 99)
    common = {"lines_measured": len(lat_ms), "lines_seen": count[0], "rate": rate, "seconds": secs,
              "p90_ms": percentile(lat_ms, 90), "max_ms": max(lat_ms)}
    note = (f"trainer prints {rate:g} time-stamped lines/s (every 10th a `step N | … | 12.8K tok/s` "
            f"line) for {secs:g} s; follow_log streams job.log over the one SSH connection")
    h.add(Figure("latency_p50", f"`logs -f` write→print latency p50 @ {rate:g} lines/s", "ms",
                    "≤ 100 ms", p50, None, None, p50 <= 100, common, note))
    h.add(Figure("latency_p99", f"`logs -f` write→print latency p99 @ {rate:g} lines/s", "ms",
                    "≤ 300 ms", p99, None, None, p99 <= 300, common, note))
    h.add(Figure("supervisor_cpu", f"supervisor CPU @ {rate:g} lines/s for {secs:g} s",
                    "% core", "≤ 2 % of a core", cpu, None, None, cpu <= 2,
                    {"window_s": b["t"] - a["t"], "cpu_s": b["cpu"] - a["cpu"]},
                    "utime+stime of the supervisor (not its children) over the train phase, "
                    "from /proc/PID/stat in the container"))
    h.add(Figure("supervisor_rss", "supervisor peak RSS (VmHWM)", "MB", "≤ 40 MB", rss, None,
                    None, rss <= 40, {"vmrss_mb": (b["rss_kb"] or 0) / 1024,
                                      "vmhwm_mb": (b["hwm_kb"] or 0) / 1024}))
    return job


def bulk(h: Harness, job: str) -> None:
    size = h.sizes.bulk_mb * 1_000_000
    path = h.jpath(job, "bulk.log")
    line = b"1732890000.123456 step 123456 | loss 1.2345 | 12.8K tok/s | lr 3.0e-4 grad-norm 0.98\n"
    with open(path, "wb") as f:
        block = line * (1_000_000 // len(line))
        while f.tell() + len(block) <= size:
            f.write(block)
        f.write(line * ((size - f.tell()) // len(line)))
    size = path.stat().st_size
    base_argv = h.ssh_pct("cat", f"{HOME}/jobs/{job}/bulk.log")
    ours, base = [], []
    for _ in range(h.sizes.reps):
        got = [0]

        def count(chunk: bytes) -> None:
            got[0] += len(chunk)

        t0 = time.perf_counter()
        follow_log(h.target, job, file="bulk.log", follow=False, write=count,
                   notice=lambda m: None)
        ours.append(size / (time.perf_counter() - t0) / 1e6)
        if got[0] != size:
            raise RuntimeError(f"follow_log delivered {got[0]} of {size} bytes")
        t0 = time.perf_counter()
        subprocess.run(base_argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, check=True)
        base.append(size / (time.perf_counter() - t0) / 1e6)
    path.unlink()
    o, b = median(ours), median(base)
    h.add(Figure("bulk", f"`logs -f` bulk: a {size / 1e6:.0f} MB log", "MB/s", "≥ 0.8× its throughput",
                    o, b, o / b, o / b >= 0.8, {"ours_mb_s": ours, "baseline_mb_s": base},
                    "ours: follow_log(follow=False) (agent `tail` → pct exec → paramiko); "
                    "baseline: `ssh … pct exec 200 -- cat FILE > /dev/null`"))


def rollback(h: Harness) -> None:
    spec = h.write_spec("rollback.yaml", profile="slow", trainer="--lines 40 --rate 40")
    modes = {"prebuilt": [], "reinstall_from_index": [], "reinstall_from_uv_cache": []}
    steps = []  # each prebuilt switch: (ms after the decision, event) up to rollback_done
    for _ in range(h.sizes.reps):
        for mode, out in modes.items():
            if mode != "prebuilt" and not h.remove(f"{HOME}/envs/fast-*"):
                raise RuntimeError("no fast venv to delete")
            if mode == "reinstall_from_index":
                h.remove(f"{HOME}/uv-cache")
            job, _ = h.submit(spec)
            st = h.succeeded(job, "fast")
            ev = h.events(job)
            done = [e for e in ev if e["type"] == "rollback_done"]
            if not done or done[-1]["from"] != "slow" or done[-1]["signal"] != "low_throughput":
                raise RuntimeError(f"job {job}: no slow → fast rollback ({st.get('rollbacks')})")
            built = any(e["type"] == "env_build" and e.get("profile") == "fast" for e in ev)
            if built != (mode != "prebuilt"):
                raise RuntimeError(f"job {job} ({mode}): fast venv built = {built}")
            out.append(done[-1]["took"])
            if mode == "prebuilt":
                t0 = done[-1]["decided_at"]
                steps.append((done[-1]["took"], [(round((e["t"] - t0) * 1000, 1), e["type"]) for e in ev
                                                 if t0 - 0.001 <= e["t"] <= t0 + done[-1]["took"] + 0.05]))
    o = median(modes["prebuilt"])
    for key, mode, what in (("rollback", "reinstall_from_index", "venv and uv cache deleted: uv "
                             "downloads the wheel from the loopback index again"),
                            ("rollback_uvcache", "reinstall_from_uv_cache", "venv deleted, uv cache "
                             "kept: uv installs from its cache")):
        b = median(modes[mode])
        h.add(Figure(key, "rollback: decision → trainer running on known-good"
                        + (" (baseline from uv cache)" if key == "rollback_uvcache" else ""), "s",
                        "≤ 2 s and ≥ 20× faster", o, b, b / o, o <= 2 and b / o >= 20,
                        {"prebuilt_s": modes["prebuilt"], f"{mode}_s": modes[mode],
                         "prebuilt_steps_ms": sorted(steps)[len(steps) // 2][1] if steps else []},
                        "the supervisor's rollback_done.took (decision → trainer spawned on the "
                        "known-good profile, its venv prebuilt); baseline: the same with the venv "
                        f"reinstalled first ({what}; uv venv + uv pip install + verify)"))
