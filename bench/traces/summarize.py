"""Figures from recorded traces (trace v1): tok/s per run, checkpoint-save dips, the
ramp after a (re)start, compile-race outcomes.

  python3 summarize.py TRACE.jsonl.gz ... [--json]

The rate parsers here are for reading our own recordings only (HF's tqdm bar,
nanoGPT's ``time Y ms``, dflash_mini's ``K tok/s``); gpujob's own parsers are the
supervisor's.
"""

from __future__ import annotations

import gzip
import json
import re
import statistics
import sys

TQDM = re.compile(r"(\d+)/(\d+) \[[^\]]*?,\s*([\d.]+)(it/s|s/it)\]")
NANO = re.compile(r"^iter (\d+): loss [\d.]+, time ([\d.]+)ms")
DFL = re.compile(r"^step (\d+) \| loss [\d.]+ \| ([\d.]+)K tok/s")
FX = "Detected that you are using FX to symbolically trace a dynamo-optimized function"


def load(path):
    recs = []
    with gzip.open(path, "rt", encoding="utf-8") as f:
        try:
            for line in f:
                try:
                    recs.append(json.loads(line))
                except ValueError:
                    break
        except (EOFError, OSError):
            pass
    return recs[0], recs[1:]


def samples(header, recs):
    tps = header["meta"].get("tokens_per_step") or 0
    out, last_step = [], None
    for r in recs:
        line = r.get("out")
        if line is None:
            continue
        m = TQDM.search(line)
        if m:
            step, rate = int(m.group(1)), float(m.group(3))
            if m.group(4) == "s/it":
                rate = 1.0 / rate if rate else 0.0
            if step == last_step or step == 0:
                continue  # a redraw of the same step (the close of the bar) adds nothing
            last_step = step
            out.append((r["t"], rate * tps, step))
            continue
        m = NANO.search(line)
        if m:
            ms = float(m.group(2))
            if ms > 0:
                out.append((r["t"], tps / (ms / 1000.0), int(m.group(1))))
            continue
        m = DFL.search(line)
        if m:
            out.append((r["t"], float(m.group(2)) * 1000.0, int(m.group(1))))
    return out


def bursts(recs, gap=2.0):
    evs = [r for r in recs if "ckpt" in r]
    groups = []
    for e in evs:
        if groups and e["t"] - groups[-1][-1]["t"] <= gap:
            groups[-1].append(e)
        else:
            groups.append([e])
    return [{"start": g[0]["t"], "end": g[-1]["t"], "files": len({e["ckpt"] for e in g}),
             "bytes": sum(e["size"] for e in g if e["op"] != "gone")} for g in groups]


def summarize(path):
    header, recs = load(path)
    meta = header["meta"]
    t0 = next((r["t"] for r in recs if "run" in r), recs[0]["t"] if recs else 0)
    t_exit = next((r["t"] for r in recs if "exit" in r), None)
    exit_rc = next((r["exit"] for r in recs if "exit" in r), None)
    s = samples(header, recs)
    res = {"name": header["name"], "trainer": meta.get("trainer"), "profile": meta.get("profile"),
           "resume": bool(meta.get("resume")), "exit": exit_rc,
           "wall_s": round(t_exit - t0, 1) if t_exit else None, "samples": len(s),
           "lines": sum(1 for r in recs if "out" in r)}
    text = [r["out"] for r in recs if "out" in r]
    if meta.get("trainer") == "compile_race":
        res["race"] = {"hung_sigabrt": any("Fatal Python error: Aborted" in x for x in text),
                       "ok_threads": sum(1 for x in text if re.match(r"thread \d+: ok", x)),
                       "failed_threads": sum(1 for x in text if re.match(r"thread \d+: FAILED", x)),
                       "fx_error_threads": sum(1 for x in text if re.match(r"thread \d+: FAILED", x)
                                               and FX in x),
                       "summary": next((x for x in text if x.startswith("race:")), None)}
        return res
    if not s:
        return res
    first = s[0][0]
    res["first_sample_s"] = round(first - t0, 1)
    saves = bursts(recs)
    steady = [v for t, v, _ in s if t - first >= 15]
    clean = [v for t, v, _ in s if t - first >= 15
             and not any(b["start"] - 1 <= t <= b["end"] + 5 for b in saves)]
    med = statistics.median(clean or steady or [v for _t, v, _ in s])
    res["median_tok_s"] = round(med)
    res["median_tok_s_all_after_15s"] = round(statistics.median(steady)) if steady else None
    res["steady_s"] = round(s[-1][0] - first - 15, 1)
    dips = []
    for b in saves:
        around = [(t, v) for t, v, _ in s if b["start"] - 1 <= t <= b["end"] + 10]
        if not around:
            dips.append({"at_s": round(b["start"] - t0, 1), "save_s": round(b["end"] - b["start"], 2),
                         "files": b["files"], "min_ratio": None})
            continue
        low = [(t, v) for t, v in around if v < 0.9 * med]
        gaps = [t2 - t1 for (t1, _), (t2, _) in zip([(t, v) for t, v, _ in s][:-1],
                                                    [(t, v) for t, v, _ in s][1:])
                if b["start"] - 1 <= t2 <= b["end"] + 10]
        dips.append({"at_s": round(b["start"] - t0, 1), "save_s": round(b["end"] - b["start"], 2),
                     "files": b["files"], "mb": round(b["bytes"] / 1e6, 1),
                     "min_ratio": round(min(v for _t, v in around) / med, 3),
                     "below_90pct_s": round(low[-1][0] - low[0][0], 2) if low else 0.0,
                     "below_90pct_samples": len(low),
                     "max_sample_gap_s": round(max(gaps), 2) if gaps else None})
    res["saves"] = dips
    ramp = [round(v / med, 2) for _t, v, _ in s[:20]]
    reach = next((t for t, v, _ in s if v >= 0.9 * med), None)
    res["ramp_first20_ratio"] = ramp
    res["to_90pct_of_median_s"] = round(reach - first, 1) if reach else None
    res["sample_rate_hz"] = round(len(s) / max(1e-9, s[-1][0] - first), 1)
    return res


def main(argv):
    as_json = "--json" in argv
    out = [summarize(p) for p in argv if p != "--json"]
    if as_json:
        print(json.dumps(out, indent=1))
        return 0
    for r in out:
        print(json.dumps(r))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
