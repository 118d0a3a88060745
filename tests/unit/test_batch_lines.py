"""The watch loop takes the lines of one read together (issue 25, supervisor CPU): the
splitter's one decode, the sources' candidate lines, the chunk's signature prefilter,
the trace's lines built as one string, and ``on_lines``. Each is checked against the
line-by-line way it replaces, which stays the reference (and the fallback)."""

from __future__ import annotations

import collections
import json
import random
from types import SimpleNamespace

import pytest

from gpujob.agent.base import trace
from gpujob.agent.base.defaults import section
from gpujob.agent.base.staterec import StateRecord
from gpujob.agent.judge import signals, sources, throughput
from gpujob.agent.supervisor.parts import History, PolicyHolder
from gpujob.agent.supervisor.watch import Watch
from gpujob.agent.supervisor.watchpause import PauseWatch

BENCH = ["1732890000.{:06d} step {} | loss 0.1234 | 12.{}K tok/s",
         "1732890000.{:06d} seq {} | data loader: batch ready"]
ODD = ["", " ", "tok/s", "12.8K tok/s", "tok/s: 12.8K", "\x1b[32m12.8K tok/s\x1b[0m", "t\x1b[0mok 5 tok/s",
       "5K t\x1b[0mok/s", "12 TOK/S",
       "[rank0]: step 3 | 5K tok/s", "[rank1]: step 3 | 7K tok/s", "rank 2: 9K tok/s",
       "[default0]: 1K tokens/sec",
       "tps: 12,800", "wps: 1.5k", "TPS: 99", "tpſ: 5", "step 9 | tps: 3k",
       "  1%|▏ | 12/1000 [00:01<01:40, 9.8it/s]",
       "5/100 [00:10, 3.20s/it]", "{'loss': 1.0, 'train_tokens_per_second': 1234.5, 'step': 4}",
       '{"tokens_per_second": 77.0, "global_step": 8}', "CUDA out of memory. Tried to allocate",
       "İ tok/s 3K tok/s",
       "Kelvin 4K tok/s", "\x9b31m 8K tok/s",
       "Detected that you are using FX to symbolically trace a dynamo-optimized function",
       "RuntimeError: boom", "NCCL watchdog timeout", "é\udc80 5K tok/s", "Evaluating: 10%",
       "my-signature here"]


def _stream(rng, n):
    out = []
    for k in range(n):
        r = rng.random()
        out.append(rng.choice(ODD) if r < 0.3 else BENCH[0].format(k, k, k % 10) if r < 0.45
                   else BENCH[1].format(k, k))
    return out


class _Slow(throughput.LineSplitter):
    def _feed_lf(self, data):  # the line-by-line way only
        return None


def test_splitter_reads_a_stream_as_the_line_by_line_way_does():
    rng = random.Random(7)
    alphabet = [b"a", b"\n", b"\r", b"\r\n", b"\xe2\x82\xac", b"\xe2\x82", b"\xff", b"\xf0\x9f\x98", b"\x80",
                b"tok/s "]
    for trial in range(400):
        data = b"".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 300)))
        if trial % 3 == 0:
            data = data.replace(b"\r", b"")  # the fast way's case
        max_line = rng.choice([4, 5, 8, 64, 1 << 16])
        fast, slow = throughput.LineSplitter(max_line), _Slow(max_line)
        got, want = [], []
        pos = 0
        while pos < len(data):
            step = rng.randrange(1, 40)
            got += fast.feed(data[pos:pos + step])
            want += slow.feed(data[pos:pos + step])
            pos += step
        assert got + fast.flush() == want + slow.flush(), (data, max_line)


def test_splitter_takes_a_read_whole_and_keeps_its_partial_line():
    s = throughput.LineSplitter()
    assert s.feed(b"a\nb\xe2\x82") == ["a"]
    assert s.feed(b"\xac\n\n") == ["b€", ""]
    assert s.flush() == []


@pytest.mark.parametrize("fmt,extra", [("ktok", {}), ("torchtitan", {}), ("tqdm", {"tokens_per_step": 100}),
                                       ("hf", {}), ("regex", {"pattern": r"(?P<value>\d+) tok/s"})])
@pytest.mark.parametrize("ranks", ["first", "sum"])
def test_only_the_candidate_lines_need_parsing(fmt, extra, ranks):
    """The samples from the candidate lines alone are the samples from every line (the
    rank merge's state included); a line the parser reads is always a candidate."""
    tp = section({"throughput": {"format": fmt, "ranks": ranks, **extra}}, "throughput")
    rng = random.Random(3)
    for _ in range(60):
        lines = _stream(rng, rng.randrange(1, 40))
        every, some = sources.line_source(tp), sources.line_source(tp)
        want = [(i, got) for i, line in enumerate(lines) if (got := every.from_line(line)) is not None]
        cands = some.candidates(lines)
        assert cands == sorted(set(cands))
        got = [(i, g) for i in cands if (g := some.from_line(lines[i])) is not None]
        assert got == want


def test_a_read_of_plain_lines_has_no_candidate_but_its_samples():
    src = sources.line_source(section({"throughput": {"format": "ktok"}}, "throughput"))
    lines = [BENCH[k % 2].format(k, k, 1) for k in range(20)]
    assert src.candidates(lines) == list(range(0, 20, 2))
    assert src.candidates(lines[1::2]) == []


def test_a_read_that_may_hit_a_signature_is_scanned_line_by_line():
    sigs = ["my-signature", ""]
    rng = random.Random(5)
    for _ in range(300):
        lines = _stream(rng, rng.randrange(1, 12))
        hit = any(signals.scan_line(line, sigs) for line in lines)
        assert not hit or signals.may_hit("\n".join(lines), sigs)
    plain = "\n".join(BENCH[k % 2].format(k, k, 1) for k in range(50))
    assert not signals.may_hit(plain, sigs)
    assert signals.may_hit(plain + "\nmy-signature", sigs)
    assert signals.may_hit(plain + "\nCUDA out of memory", [])


def test_trace_lines_are_the_bytes_of_one_record_a_line(tmp_path):
    lines = _stream(random.Random(2), 200) + ['"quoted" \\ back', "\x00\x07", "\U0001f600"]
    a, b = trace.TraceWriter(str(tmp_path / "a"), {}), trace.TraceWriter(str(tmp_path / "b"), {})
    (tmp_path / "a").mkdir(), (tmp_path / "b").mkdir()
    for line in lines:
        a.out(1732890000.1234567, line)
    b.out_lines(1732890000.1234567, lines)
    b.out_lines(5.0, [])
    assert b"".join(a._buf) == b"".join(b._buf)
    assert json.loads(b"".join(b._buf).splitlines()[-1]) == {"t": 1732890000.123, "out": "\U0001f600"}


def _watch(tmp, signatures=(), spec=None, fleet=None, runner=None, checkpoints=None, journal=None):
    """A Watch built through its constructor with small fakes around it (what a test does
    not look at answers nothing)."""
    spec = {"name": "n"} if spec is None else spec
    job = SimpleNamespace(job_id="j", spec=spec, rb={}, workdir=str(tmp), home=SimpleNamespace(root=str(tmp)),
                          cache_key=lambda profile: "shared")
    journal = journal or SimpleNamespace(dir=str(tmp), state=dict, record=StateRecord, event=lambda *a,
                                         **k: None, set_state=lambda **k: None)
    report = SimpleNamespace(say=lambda text: None, set_state=lambda *a, **k: None,
                             notifier=SimpleNamespace(emit=lambda *a, **k: None),
                             metrics=SimpleNamespace(write=lambda: None))
    ledger = SimpleNamespace(baseline=lambda profile: None, last_good=lambda: None,
                             status=lambda profile: None)
    holder = PolicyHolder(None)
    trimmer = SimpleNamespace(trim=lambda *a, **k: None, trim_before=lambda *a: None, start_of=lambda name: 0)
    return Watch(job, journal, ledger, report, runner, SimpleNamespace(values=lambda profile, gpu=None: {}),
                 checkpoints, PauseWatch(job, journal, holder), lambda *a, **k: None, None, holder,
                 History({}), fleet, trimmer, lambda: None, signatures=list(signatures))


class _Fleet:
    """A node whose own_sample records what the watch loop's line side gave it (a Watch
    hands every sample to its fleet's ``own_sample`` when it has one)."""

    def __init__(self, stop_at):
        self.stop_at, self.seen, self.watch = stop_at, [], None

    def own_sample(self, run, value, step, t):
        self.seen.append((value, step, len(run.hits), len(run.pauses.intervals)))
        if len(self.seen) % 3 == 1:  # a verdict that changed: its record follows its line in the trace
            self.watch.trace_decision(SimpleNamespace(verdict="ok", reason=f"sample {len(self.seen)}"), t)
        return "stop" if len(self.seen) == self.stop_at else None


def _sup(tmp, signatures, pause_pattern, stop_at):
    """The watch loop's line side with a journal and a fleet that records what it saw."""
    fleet = _Fleet(stop_at)
    fleet.watch = _watch(tmp, signatures, {"name": "n", "throughput": {"format": "ktok",
                                                                       "pause_pattern": pause_pattern}},
                         fleet)
    return fleet.watch


def _run(sup, tp):
    run = SimpleNamespace(start=0.0, profile="a", phase="train", baseline=None,
                          tail=collections.deque(maxlen=200),
                          hits=[], hit_at=None, watch_tps=True, source=sources.line_source(tp))
    sup.pause.pause_setup(run)
    return run


@pytest.mark.parametrize("signatures,pause,stop_at", [([], None, None), (["my-signature"], None, None),
                                                       ([], None, 3), ([], "^Evaluating", 2),
                                                       (["never printed"], None, 1)])
def test_on_lines_takes_a_read_as_on_line_takes_its_lines(tmp_path, signatures, pause, stop_at):
    tp = section({"throughput": {"format": "ktok", "ranks": "sum"}}, "throughput")
    rng = random.Random(11)
    for k in range(40):
        reads = [_stream(rng, rng.randrange(0, 30)) if k % 2
                 else [BENCH[j % 2].format(j, j, 1) for j in range(25)]
                 for _ in range(4)]
        (tmp_path / f"{k}a").mkdir(), (tmp_path / f"{k}b").mkdir()
        one, batch = _sup(tmp_path / f"{k}a", signatures, pause, stop_at), _sup(tmp_path / f"{k}b",
                                                                                signatures, pause,
                                                                                 stop_at)
        r1, r2 = _run(one, tp), _run(batch, tp)
        for t, lines in enumerate(reads):
            o1 = next((o for line in lines if (o := one.on_line(r1, line, float(t)))), None)
            o2 = batch.on_lines(r2, lines, float(t))
            assert o1 == o2
            if o1:
                break
        assert one.fleet.seen == batch.fleet.seen and batch._owed is None
        assert (list(r1.tail), r1.hits, r1.hit_at) == (list(r2.tail), r2.hits, r2.hit_at)
        assert b"".join(one.pause._trace._buf) == b"".join(batch.pause._trace._buf)


@pytest.mark.parametrize("version", [(3, 11), (3, 9)])
def test_the_policy_finds_the_first_sample_at_or_after_a_time(monkeypatch, version):
    """Each decision's searches (bisect's key on 3.10+, the loop before it) find what a scan finds."""
    from gpujob.agent.judge import policy
    monkeypatch.setattr(policy, "sys", SimpleNamespace(version_info=version))
    rng = random.Random(4)
    for _ in range(300):
        ts = sorted(rng.choice([0.0, 1.0, 1.5, 2.0, 3.0]) for _ in range(rng.randrange(0, 9)))
        samples = [policy.Sample(t, 1.0) for t in ts]
        t, lo = rng.choice([-1.0, 0.0, 1.0, 1.2, 2.0, 5.0]), rng.randrange(0, len(ts) + 1)
        want = next((i for i in range(lo, len(ts)) if ts[i] >= t), len(ts))
        assert policy._first_at_or_after(samples, t, lo) == want


def test_a_policy_reads_its_window_and_limit_once():
    from gpujob.agent.judge.policy import PolicyConfig
    cfg = PolicyConfig(window="30s", failure_limit=3)
    assert (cfg.window_n, cfg.window_s, cfg.limit_n, cfg.limit_s, cfg.needed_span()) == (None, 30.0, 3, None,
                                                                                         60.0)
    assert {"window_n", "window_s", "limit_n", "limit_s"} <= set(vars(cfg))
    assert cfg == PolicyConfig(window="30s", failure_limit=3)  # the cached values are no fields


def test_a_policy_remembers_its_thresholds_by_baseline():
    from gpujob.agent.judge import policy
    cfg = policy.PolicyConfig(min=100.0, min_ratio=0.9, window=3, failure_limit=2)
    other = policy.PolicyConfig(min=5.0, window=3, failure_limit=2)
    for base in [None, 50.0, 1000.0, 0.0, 50.0] + [float(b) for b in range(100)]:
        assert policy.threshold(cfg, base) == policy._threshold(cfg, base)
        assert policy.threshold(other, base) == (5.0, "min")
    assert policy.threshold(cfg, 1000.0)[0] == 900.0 and len(cfg.thresholds) == 64  # bounded


def test_the_relay_cursor_and_a_sample_record_keep_their_bytes(tmp_path):
    """Written before every append / for every sample: formatted without a new JSON encoder
    each time, the same bytes as json.dumps(…, sort_keys=True)."""
    from gpujob.agent.home import relay
    from gpujob.agent.home.journal import Home, Journal
    for cur in ({"src": "train.log", "off": 0, "len": 1, "dst": 0},
                {"src": 'odd "name"\\é.log', "off": 1 << 40, "len": 5000, "dst": 123456789}):
        assert relay._encode(cur) == json.dumps(cur, sort_keys=True).encode()
    home = Home(str(tmp_path))
    (tmp_path / "jobs" / "j").mkdir(parents=True)
    j = Journal(home, "j")
    rec = dict(t=1732890000.123, value=12811.25, step=None, verdict="ok", median=float("nan"), profile="fast")
    assert j.sample(**rec) == 0
    line = (tmp_path / "jobs" / "j" / "samples.jsonl").read_bytes()
    assert line == (json.dumps(dict(rec, type="sample"), sort_keys=True) + "\n").encode()
    assert j.sample(**rec) == len(line)


class _Proc:
    """A phase command that prints its last line and exits between two looks: the relay
    has that line once ``running`` first answered; every later answer is False."""

    def __init__(self, relay):
        self.relay, self.asked, self.returncode, self.pgid = relay, 0, 0, 1

    def running(self):
        self.asked += 1
        if self.asked == 1:
            self.relay.pending.append(b"the last line\n")
            return True
        return False

    def wait_fd(self):
        return None


class _Relay:
    dir, src, offset = "", None, 0  # (no log: the quiet wait polls)

    def __init__(self):
        self.pending, self.copied = [], []

    def poll(self):
        data = b"".join(self.pending)
        self.pending.clear()
        self.copied.append(data)
        return data

    def drain(self):
        while True:
            data = self.poll()
            if not data:
                return
            yield data


class _Runner:
    """The runner a Watch is built with: its relay, and a start that gives a _Proc."""

    def __init__(self):
        self.relay, self.proc, self.ended = _Relay(), None, []

    def start_phase(self, argv, env, cwd, logname, extra, started=None):
        return _Proc(self.relay)

    def end_phase(self, durable=True):
        self.ended.append(durable)


class _Checkpoints:
    """No train.checkpoint: the gate lets every outcome through, nothing is polled."""

    def gate(self, run, outcome, t):
        return outcome

    def poll_checkpoints(self, run, t, force=False):
        pass

    def close_checkpoints(self, run, code):
        pass

    def checkpoint_watch(self, profile, adopt):
        return None


def test_a_command_that_ends_between_two_looks_has_its_last_output_read(tmp_path):
    """The loop asked ``running`` twice per quiet turn: a command that printed and ended
    between the two asks left the loop without its last output read (not relayed into
    job.log, not parsed). It asks once per turn now."""
    runner = _Runner()
    loop = _watch(tmp_path, runner=runner, checkpoints=_Checkpoints())
    out = loop.watch(["x"], {}, "warmup.log", "a", timeout=None, watch_tps=False)
    assert out.kind == "done" and runner.ended == [False]
    seen = [r["out"] for r in trace.read_records(str(tmp_path / trace.NAME)) if "out" in r]  # every line read
    assert seen == ["the last line"] and b"the last line\n" in runner.relay.copied
