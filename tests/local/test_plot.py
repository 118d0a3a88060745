"""``gpujob plot`` (issue 12, item 5): the pure series core on made-up journals, then the
demo's real job (a slow build rolled back to the known-good one) drawn to png, svg and
html by the real ``gpujob`` entry point, and the files opened and checked."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from gpujob.show import plotdata
from helpers import REPO

GPUJOB = str(Path(sys.executable).parent / "gpujob")
SVG = "{http://www.w3.org/2000/svg}"


# ---- the pure core ----------------------------------------------------------------

def journal():
    ev = [{"t": 100.0, "type": "state", "state": "preparing", "phase": "env", "profile": "slow"},
          {"t": 101.0, "type": "state", "state": "training", "phase": "train", "profile": "slow"},
          {"t": 102.0, "type": "decision", "verdict": "breach", "evidence": {"threshold": 10000.0,
                                                                             "threshold_source": "min"}},
          {"t": 103.0, "type": "rollback", "decided_at": 102.5, "from": "slow", "to": "fast",
           "signal": "low_throughput", "reason": "median 4.3K < 10K"},
          {"t": 103.1, "type": "state", "state": "rolling_back", "phase": "env"},
          {"t": 103.2, "type": "state", "state": "training", "phase": "train", "profile": "fast"},
          {"t": 104.0, "type": "decision", "verdict": "ok", "evidence": {"threshold": 11610.0,
                                                                         "threshold_source": "baseline"}},
          {"t": 105.0, "type": "known_good", "profile": "fast", "baseline": 12900.0},
          {"t": 106.0, "type": "state", "state": "succeeded", "phase": "done"}]
    samples = [{"t": 101.5 + i * 0.25, "type": "sample", "value": 4300.0, "profile": "slow"}
               for i in range(4)]
    samples += [{"t": 103.5 + i * 0.25, "type": "sample", "value": 12800.0, "profile": "fast"}
                for i in range(8)]
    return ev, samples


def test_series_holds_phases_threshold_baselines_and_rollbacks():
    ev, samples = journal()
    s = plotdata.series(ev, samples, {"job_id": "j-1", "ledger": {"profiles": {
        "other": {"status": "good", "baseline": 9000.0}, "slow": {"status": "bad"}}}})
    assert s["duration"] == 6.0 and len(s["points"]) == 12 and s["points"][0]["t"] == 1.5
    assert [(p["phase"], p["start"], p["end"]) for p in s["phases"]] == [
        ("prepare", 0.0, 1.0), ("train", 1.0, 3.1), ("rollback", 3.1, 3.2), ("train", 3.2, 6.0)]
    assert [(th["t"], th["value"]) for th in s["threshold"]] == [(2.0, 10000.0), (4.0, 11610.0)]
    assert s["baselines"] == {"fast": 12900.0, "other": 9000.0}  # the bad one is no baseline
    [rb] = s["rollbacks"]
    assert rb["t"] == 2.5 and plotdata.rollback_label(rb) == "rollback slow → fast (low_throughput)"


def test_minute_summaries_fill_only_what_the_full_rate_samples_no_longer_hold():
    ev, samples = journal()
    ev.insert(0, {"t": 40.0, "type": "samples_1m", "since": 0.0, "median": 5000.0, "min": 4000.0,
                  "max": 6000.0, "n": 60, "profile": "slow"})
    ev.append({"t": 106.0, "type": "samples_1m", "since": 101.0, "median": 12800.0, "min": 12800.0,
               "max": 12800.0, "n": 12, "profile": "fast"})  # covered by the samples: not drawn twice
    s = plotdata.series(ev, samples)
    assert [m["median"] for m in s["minutes"]] == [5000.0]


def test_terminal_grid_marks_the_rollback_and_the_threshold():
    ev, samples = journal()
    s = plotdata.series(ev, samples)
    rows = plotdata.grid(s, width=40, height=10)
    assert len(rows) == 11 and all(len(r) == 41 for r in rows)  # label column + 40 cells, + the phase strip
    kinds = {k for r in rows for _, k in r}
    assert {"point", "threshold", "rollback", "baseline", "phase"} <= kinds
    assert rows[0][1 + [c for c, (_, k) in enumerate(rows[0][1:]) if k == "rollback"][0]][0] == "1"
    strip = "".join(ch for ch, _ in rows[-1][1:])
    assert re.fullmatch("p+t+R+t+", strip), strip


def test_empty_journal_is_no_error():
    s = plotdata.series([], [], {"window": {"threshold": 5.0}})
    assert s["points"] == [] and s["threshold"][0]["value"] == 5.0
    assert len(plotdata.grid(s)) == 13


# ---- the demo's job, through the real entry point ----------------------------------

def run(args, env, **kw):
    return subprocess.run([GPUJOB, *args], env=env, capture_output=True, cwd=str(REPO), timeout=300, **kw)


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    home = tmp_path_factory.mktemp("home")
    env = dict(os.environ, HOME=str(home), XDG_STATE_HOME=str(home / "state"))
    env.pop("GPUJOB_HOSTS", None)
    env.pop("COLUMNS", None)
    p = run(["demo", "--json"], env)
    assert p.returncode == 0, p.stdout.decode()[-2000:] + p.stderr.decode()[-2000:]
    recs = [json.loads(ln) for ln in p.stdout.decode().splitlines()]
    assert recs[-1]["rollback"]["from"] == "slow"  # demo --json: JSON Lines, the rollback last
    job = [r for r in recs if "status" in r][-1]["status"]["job"]
    return {"env": env, "home": home, "job": job, "dir": home / ".local/share/gpujob/demo/jobs" / job}


def test_png_of_the_demo_job(demo, tmp_path):
    import matplotlib.image as mpimg
    import numpy as np
    out = tmp_path / "demo.png"
    p = run(["plot", demo["job"], "-o", str(out)], demo["env"])
    assert p.returncode == 0, p.stderr.decode()
    assert f"wrote {out}" in p.stdout.decode()
    assert out.stat().st_size > 10_000
    img = mpimg.imread(out)
    assert img.shape[0] >= 400 and img.shape[1] >= 1000
    rgb = img[..., :3].reshape(-1, 3)
    assert rgb.std() > 0.05  # not blank
    assert len(np.unique((rgb * 255).astype(int), axis=0)) > 20  # phases, points, lines in colour
    assert not list(tmp_path.glob(".demo.png.tmp*"))


def test_svg_of_the_demo_job_has_the_rollback_threshold_and_points(demo, tmp_path):
    data = json.loads(run(["plot", demo["job"], "--json"], demo["env"]).stdout)
    fast = [pt for pt in data["points"] if pt["profile"] == "fast"]
    slow = [pt for pt in data["points"] if pt["profile"] == "slow"]
    assert fast and slow and data["rollbacks"] and data["baselines"]["fast"] > data["threshold"][0]["value"]
    out = tmp_path / "demo.svg"
    assert run(["plot", demo["job"], "-o", str(out)], demo["env"]).returncode == 0
    root = ET.parse(out).getroot()
    assert root.tag == f"{SVG}svg"
    by_id = {el.get("id"): el for el in root.iter() if el.get("id")}
    texts = ["".join(el.itertext()).strip() for el in root.iter(f"{SVG}text")]
    assert "rollback slow → fast (low_throughput)" in texts
    assert any(t.startswith("threshold 10K tok/s (min)") for t in texts)
    assert any(t.startswith("known-good fast: ") for t in texts)
    assert "threshold" in by_id and "rollback-0" in by_id and "baseline-fast" in by_id
    assert any(k.startswith("phase-") for k in by_id)
    assert len(list(by_id["samples-fast"].iter(f"{SVG}use"))) == len(fast)  # one marker a sample
    assert len(list(by_id["samples-slow"].iter(f"{SVG}use"))) == len(slow)


def test_html_embeds_the_svg_and_the_terminal_plot(demo, tmp_path):
    out = tmp_path / "demo.html"
    assert run(["plot", "-o", str(out)], demo["env"]).returncode == 0  # default: the latest job
    page = out.read_text()
    assert page.startswith("<!DOCTYPE html>") and "<svg" in page and "<?xml" not in page
    assert "rollback slow → fast" in page and f"<title>gpujob plot: {demo['job']}" in page
    p = run(["plot", demo["job"]], dict(demo["env"], COLUMNS="100"))
    term = p.stdout.decode()
    assert p.returncode == 0 and f"tok/s of {demo['job']}" in term
    assert "1 rollback slow → fast (low_throughput)" in term and "┄" in term
    assert re.search("[\u2801-\u28ff]", term)  # braille dots: the samples


def test_a_torn_last_record_is_skipped(demo, tmp_path):
    """The supervisor died mid-write: the half line at the end is skipped, the rest drawn."""
    before = json.loads(run(["plot", demo["job"], "--json"], demo["env"]).stdout)
    for name in ("events.jsonl", "samples.jsonl"):
        with open(demo["dir"] / name, "ab") as f:
            f.write(b'{"t": 1e12, "type": "sample", "val')
    after = json.loads(run(["plot", demo["job"], "--json"], demo["env"]).stdout)
    assert len(after["points"]) == len(before["points"]) and after["rollbacks"] == before["rollbacks"]
    assert run(["plot", demo["job"], "-o", str(tmp_path / "x.svg")], demo["env"]).returncode == 0


def test_without_matplotlib_one_line_says_how_to_install(demo, tmp_path):
    shadow = tmp_path / "shadow" / "matplotlib"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError('not installed here')\n")
    env = dict(demo["env"], PYTHONPATH=str(shadow.parent))
    p = run(["plot", "-o", str(tmp_path / "x.png")], env)
    err = p.stderr.decode().strip()
    assert p.returncode == 1 and len(err.splitlines()) == 1 and "Traceback" not in err
    assert ("pip install 'gpujob-proxmox[plot]'" in err and "'gpujob[plot]'" not in err
            and not (tmp_path / "x.png").exists())
    assert run(["plot"], env).returncode == 0  # the terminal plot needs no matplotlib


def test_bad_output_names(demo, tmp_path):
    for args in (["-o", str(tmp_path / "x.pdf")], ["-o", str(tmp_path / "no" / "dir" / "x.png")]):
        p = run(["plot", *args], demo["env"])
        err = p.stderr.decode().strip()
        assert p.returncode == 2 and len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert not list(tmp_path.rglob("x.*"))
