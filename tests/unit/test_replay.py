"""Issue 22, item 7: the trace (format v1) written as the supervisor writes it, and
gpujob replay's engine over synthetic traces and samples.jsonl."""

import gzip
import json

from gpujob.agent.base import trace
from pathlib import Path

from gpujob.agent.base.fsio import json_objects
from gpujob.agent.judge.replay import replay_records, replay_sample_records, summary_line

SPEC = {"throughput": {"format": "ktok", "min_ratio": 0.8, "window": "10s", "failure_limit": "30s",
                       "pause_tail": 3.0, "good_after": 20}}


def replay_trace(path: str, spec: dict, **kw) -> tuple:
    """The file read at the edge, as cli/replay_cmds.py does (judge/replay.py takes records)."""
    return replay_records(trace.read_records(path), spec, **kw)


def replay_samples(path: str, spec: dict, **kw) -> tuple:
    return replay_sample_records(json_objects(Path(path).read_bytes()), spec, **kw)


def write_trace(tmp_path, segments):
    w = trace.TraceWriter(str(tmp_path), {"name": "t", "job": None, "recorded_by": "test", "meta": {}})
    for seg in segments:
        for rec in seg:
            w.write(rec)
    w.last_flush = -10
    w.tick(0.0)  # a sync flush, no close: a supervisor killed now leaves a readable trace
    return str(tmp_path / trace.NAME)


def good_segment(t0, profile="compiled", resume=False, save_at=None):
    recs = [{"t": t0, "run": {"profile": profile, "phase": "train", "resume": resume}}]
    for i in range(600):  # 60 s at 10 Hz, a save dip at save_at
        t = t0 + 5 + i / 10
        v = 811 if save_at is None or not save_at <= i < save_at + 10 else 360
        if save_at is not None and i == save_at:
            recs.append({"t": t + 0.3, "ckpt": "out/checkpoint-500", "op": "new", "size": 1000})
        recs.append({"t": round(t, 3), "out": f"step {i} {v}K tok/s"})
    recs.append({"t": t0 + 66, "exit": 0})
    return recs


def slow_segment(t0, slow_from=200):
    recs = [{"t": t0, "run": {"profile": "eager", "phase": "train", "resume": True}}]
    for i in range(1200):
        recs.append({"t": t0 + 5 + i / 10, "out": f"step {i} {811 if i < slow_from else 300}K tok/s"})
    recs.append({"t": t0 + 60, "recorded": {"verdict": "rollback", "reason": "live"}})
    return recs


def test_good_profile_with_saves_no_rollback_and_a_pause(tmp_path):
    path = write_trace(tmp_path, [good_segment(1000.0, save_at=300)])
    decisions, summary = replay_trace(path, SPEC, baseline=811e3)
    assert summary["rollbacks"] == 0 and summary["breaches"] == 0 and summary["pauses"] == 1
    assert {d["verdict"] for d in decisions} >= {"settling", "ok", "paused"}
    assert "0 rollback(s)" in summary_line(summary)


def test_slow_profile_rolled_back_with_detection_time_and_the_recorded_one(tmp_path):
    path = write_trace(tmp_path, [good_segment(1000.0), slow_segment(2000.0)])
    decisions, summary = replay_trace(path, SPEC)
    assert summary["segments"] == 2 and summary["rollbacks"] == 1
    seg = summary["per_segment"][1]
    slow_start = 2000.0 + 5 + 200 / 10
    took = seg["rollback_at"] - slow_start
    # ~half the 10 s window, then the breach weighed: 300K under a 649K threshold counts
    # (ln(649/300) / ln(1/0.75))^2 = 7.2 s of the 30 s failure_limit per second (agent/judge/tail.py)
    assert 6 <= took <= 14, took
    note = [d for d in decisions if d["verdict"] == "note"][0]
    assert (note["reason"].startswith("would have rolled back at t=+")
            and "recorded: at t=+60.0s" in note["reason"])
    assert summary["per_segment"][0]["known_good"] == 811e3  # the baseline segment 2 is judged against


def test_truncated_trace_is_read(tmp_path):
    path = write_trace(tmp_path, [good_segment(1000.0)])
    data = open(path, "rb").read()
    cut = tmp_path / "cut.jsonl.gz"
    cut.write_bytes(data[: len(data) - 7])
    recs = trace.read_records(str(cut))
    assert recs[0]["trace"] == 1 and len(recs) > 100


def test_samples_jsonl(tmp_path):
    p = tmp_path / "samples.jsonl"
    with open(p, "w") as f:
        for i in range(400):
            f.write(json.dumps({"t": 100 + i, "value": 100.0 if i < 100 else 40.0, "profile": "a"}) + "\n")
        f.write("not json\n")
    decisions, summary = replay_samples(str(p), {"throughput": {"format": "ktok", "min": 80, "window": 5,
                                                                "failure_limit": 3}}, profile="a")
    assert summary["rollbacks"] == 1 and decisions[-2]["verdict"] == "rollback"
    assert all({"t", "value", "verdict", "reason"} <= set(d) for d in decisions)


def test_trace_rotates_at_its_limit(tmp_path):
    w = trace.TraceWriter(str(tmp_path), {"name": "t"}, limit=1 << 16)
    import random
    rnd = random.Random(1)
    for i in range(20000):
        w.out(float(i), "%x" % rnd.getrandbits(128))
        w.tick(float(i))
    w.close()
    assert (tmp_path / trace.OLD).exists()
    assert gzip.open(tmp_path / trace.NAME).readline().startswith(b'{"trace":1,"name":"t"')
    assert len(trace.job_records(str(tmp_path))) > 1000


def test_cli_replay_samples_json(tmp_path):
    from typer.testing import CliRunner
    from gpujob.cli.main import app
    p = tmp_path / "samples.jsonl"
    p.write_text("".join(json.dumps({"t": 100 + i, "value": 30000.0 if i < 100 else 4000.0}) + "\n"
                         for i in range(300)))
    spec = Path(__file__).resolve().parents[2] / "jobs" / "fleet-torch.yaml"
    r = CliRunner().invoke(app, ["replay", str(p), "--spec", str(spec), "--json"])
    assert r.exit_code == 0, r.output
    recs = [json.loads(x) for x in r.output.splitlines() if x.strip()]
    assert recs[-1]["summary"]["rollbacks"] == 1
    assert all({"t", "value", "verdict", "reason"} <= set(d) for d in recs[:-1])
    r = CliRunner().invoke(app, ["replay", str(p)])
    assert r.exit_code != 0 and "--spec" in str(r.exception)  # main() prints it in one line


def test_cli_replay_reads_a_trace_file_at_the_edge(tmp_path):
    from typer.testing import CliRunner
    from gpujob.cli.main import app
    path = write_trace(tmp_path, [good_segment(1000.0), slow_segment(2000.0)])
    spec = Path(__file__).resolve().parents[2] / "jobs" / "fleet-torch.yaml"
    r = CliRunner().invoke(app, ["replay", path, "--spec", str(spec), "--json"])
    assert r.exit_code == 0, r.output
    recs = [json.loads(x) for x in r.output.splitlines() if x.strip()]
    assert recs[-1]["summary"]["segments"] == 2
    assert recs[-1]["summary"] == replay_trace(path, _spec_of(spec))[1]


def _spec_of(path) -> dict:
    from gpujob.spec.model import load_spec
    return load_spec(path).to_agent_dict()


def test_plot_shows_pauses():
    from gpujob.show import plotdata
    from gpujob.show.plot import legend
    events = [{"type": "state", "t": 100.0, "state": "training", "profile": "a"},
              {"type": "pause", "t": 130.0, "start": 128.0, "tail": 3.0, "why": "checkpoint c"}]
    samples = [{"t": 100.0 + i, "value": 10.0, "profile": "a"} for i in range(60)]
    s = plotdata.series(events, samples, {"pauses": [[128.0, 140.0]]})
    assert s["pauses"] == [{"start": 28.0, "end": 40.0, "why": "checkpoint c"}]
    assert any(line.startswith("‖ 1 pauses") for line in legend(s))
    assert any(c == ("‖", "phase") for c in plotdata.grid(s, 60, 8)[-1])


def test_watch_pause_side_on_ckpt_events_pauses_and_traces(tmp_path):
    """The watch loop's side of CONTRACT's checkpoint events: a pause, a journal event,
    the events in the trace, and the decision the supervisor asks for is paused."""
    from types import SimpleNamespace
    from gpujob.agent.judge.policy import PolicyConfig, Sample
    from gpujob.agent.base.staterec import StateRecord
    from gpujob.agent.supervisor.parts import PolicyHolder
    from gpujob.agent.supervisor.watchpause import PauseWatch

    class Journal:
        dir = str(tmp_path)
        def __init__(self):
            self.events, self.st = [], {}
        def event(self, kind, **kw):
            self.events.append(dict(kw, type=kind))
        def set_state(self, **kw):
            self.st.update(kw)
        def state(self):
            return self.st
        def record(self):
            return StateRecord.from_dict(self.st)

    job = SimpleNamespace(job_id="j1", spec={"name": "n", "throughput": {"pause_tail": 3.0,
                                                                          "pause_pattern": "^Evaluating"}})
    side = PauseWatch(job, Journal(), PolicyHolder(PolicyConfig(min=10.0, window=3, failure_limit=1,
                                                                settle_samples=0)))
    run = SimpleNamespace(start=0.0, profile="a", phase="train", baseline=None,
                          samples=[Sample(float(k), 20.0) for k in range(10)])
    side.pause_setup(run)
    side.on_ckpt_events(run, [{"t": 10.0, "ckpt": "out/ckpt.pt", "op": "changed", "size": 5}], 10.2)
    assert side.decide_now(run, 11.0).verdict == "paused"
    assert side.decide_now(run, 14.0).verdict == "ok"
    side.pause_line(run, "Evaluating: 10%", 20.0)
    assert side.decide_now(run, 21.0).verdict == "paused"
    assert [e["why"] for e in side.journal.events] == ["checkpoint out/ckpt.pt", "pause_pattern"]
    assert side.journal.st["pauses"] == [[8.0, 13.0], [18.0, 23.0]]
    side.trace_end(0, 30.0)
    recs = trace.read_records(str(tmp_path / trace.NAME))
    assert recs[0]["trace"] == 1 and recs[1]["run"]["profile"] == "a"
    assert {"t": 10.0, "ckpt": "out/ckpt.pt", "op": "changed", "size": 5} in recs
    assert {"t": 20.0, "out": "Evaluating: 10%"} in recs and recs[-1] == {"t": 30.0, "exit": 0}
