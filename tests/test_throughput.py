import json

import pytest

from gpujob.agent.judge.policy import Decision, PolicyConfig, Sample, decide, known_good, threshold
from gpujob.agent.judge.signals import classify_exit, find_signature, scan_line
from gpujob.agent.judge.throughput import LineSplitter, fmt_rate, make_parser, make_step_parser, sparkline, strip_ansi

# ---------------------------------------------------------------- LineSplitter


def test_splitter_newlines_cr_and_crlf():
    sp = LineSplitter()
    assert sp.feed(b"a\nb\r\nc\rd") == ["a", "b", "c"]
    assert sp.feed(b"e\n\n") == ["de", ""]
    assert sp.flush() == []


def test_splitter_crlf_split_across_feeds_counts_once():
    sp = LineSplitter()
    assert sp.feed(b"one\r") == ["one"]  # emitted at once (tqdm redraw)
    assert sp.feed(b"\ntwo\n") == ["two"]
    assert sp.feed(b"x\r") == ["x"]
    assert sp.feed(b"\r") == [""]  # a second \r is a (blank) line of its own


def test_splitter_partial_tail_and_flush():
    sp = LineSplitter()
    assert sp.feed(b"hel") == []
    assert sp.feed(b"lo wor") == []
    assert sp.feed(b"ld\npart") == ["hello world"]
    assert sp.flush() == ["part"]
    assert sp.flush() == []


def test_splitter_tqdm_redraws():
    sp = LineSplitter()
    data = (
        b"\r  0%|          | 0/100 [00:00<?, ?it/s]"
        b"\r 10%|\xe2\x96\x88         | 10/100 [00:05<00:45, 2.00it/s]"
        b"\r 20%|\xe2\x96\x88\xe2\x96\x88        | 20/100 [00:10<00:40, 2.00it/s]\n"
    )
    lines = sp.feed(data)
    assert lines[0] == ""
    assert [l.split("|")[0].strip() for l in lines[1:]] == ["0%", "10%", "20%"]
    parse = make_parser("tqdm", tokens_per_step=1000)
    assert [parse(l) for l in lines] == [None, None, 2000.0, 2000.0]


def test_splitter_utf8_split_across_feeds_and_invalid_bytes():
    sp = LineSplitter()
    euro = "€".encode()
    assert sp.feed(euro[:1]) == []
    assert sp.feed(euro[1:] + b"\n") == ["€"]
    assert sp.feed(b"\xff\xfeok\n") == ["\ufffd\ufffdok"]


def test_splitter_bounds_lines_without_newline():
    sp = LineSplitter(max_line=16)
    out = sp.feed(b"x" * 40)
    assert out == ["x" * 16, "x" * 16]
    assert sp.flush() == ["x" * 8]
    # a terminated over-long line is cut too, on a UTF-8 boundary
    sp = LineSplitter(max_line=16)
    out = sp.feed(("a" + "€" * 10 + "\n").encode())
    assert "".join(out) == "a" + "€" * 10
    assert all(len(p.encode()) <= 16 and "\ufffd" not in p for p in out)


def test_splitter_default_bound_is_64k():
    sp = LineSplitter()
    out = []
    for _ in range(100):
        out += sp.feed(b"y" * 10_000)
    out += sp.flush()
    # a million bytes with no newline come out whole, in pieces of at most 64 KiB
    assert "".join(out) == "y" * 1_000_000 and max(len(p) for p in out) == 64 * 1024


# ---------------------------------------------------------------- strip_ansi


def test_strip_ansi():
    assert strip_ansi("\x1b[31mred\x1b[0m \x1b[1;33mbold\x1b[39m") == "red bold"
    assert strip_ansi("\x1b]0;title\x07text") == "text"
    assert strip_ansi("\x1b]8;;http://x\x1b\\link\x1b]8;;\x1b\\") == "link"
    assert strip_ansi("a\x1b[2Kb\x1b[1Ac\x1b(Bd") == "abcd"


# ---------------------------------------------------------------- parsers

KTOK_MATCH = [
    ("12.8K tok/s", 12800),
    ("20 Ktok/s", 20000),
    ("4300 tok/s", 4300),
    ("1.2M tok/s", 1_200_000),
    ("4.3k tokens/s", 4300),
    ("12,800 tokens/sec", 12800),
    ("throughput 1.2e4 tok/s", 12000),
    ("step 100 | loss 2.31 | 12.8K tok/s | lr 3e-4", 12800),
    ("tok/s: 12.8K", 12800),
    ("tok/s=12800", 12800),
    ("step 10 tok/s: 12.8K", 12800),  # '10 tok/s:' is a label, not a rate
    ("\x1b[32m12.8K\x1b[0m tok/s", 12800),
    ("12.8K tok/s/gpu | 102K tok/s", 102_000),  # per-GPU forms are skipped
    ("max 12 tok/s budget", 12),  # decided: any "N tok/s" is a rate
]
KTOK_MISS = [
    "ETA 37 days",
    "step 12/1000",
    "12.8Kb/s",
    "12.8KB/s network",
    "toks",
    "12.8K tokens",
    "12.8K tok/step",
    "512 tokens/sample",
    "12.8K tok/s/gpu",
    "tok/s: n/a",
    "",
]


@pytest.mark.parametrize("line,want", KTOK_MATCH)
def test_ktok_matches(line, want):
    assert make_parser("ktok")(line) == pytest.approx(want)


@pytest.mark.parametrize("line", KTOK_MISS)
def test_ktok_near_misses(line):
    assert make_parser("ktok")(line) is None


def test_scale_multiplies():
    assert make_parser("ktok", scale=8)("1.6K tok/s") == pytest.approx(12800)


TT_LINE = (
    "\x1b[31mstep: 10  \x1b[32mloss:  7.1234  \x1b[33mmemory: 31.20GiB(40.00%)  "
    "\x1b[34mtps: 12,800  \x1b[36mtflops: 400.10  \x1b[35mmfu: 40.00%\x1b[39m"
)


def test_torchtitan():
    p = make_parser("torchtitan")
    assert p(TT_LINE) == 12800
    assert p("step: 10  loss: 7.1  memory: 31.2GiB(40.0%)  tps: 12,800  tflops: 400.1  mfu: 40%") == 12800
    assert p("step:  1  loss: 12.0  wps: 1,234  mfu: 1%") == 1234
    assert make_parser("torchtitan", scale=8)(TT_LINE) == 102_400
    for miss in ["step: 10  loss: 7.1", "max_tps: 100", "steps: 100", "tps: n/a", "12.8K tok/s"]:
        assert p(miss) is None, miss


def test_tqdm():
    p = make_parser("tqdm", tokens_per_step=1000)
    assert p("12%|█▏        | 1234/10000 [12:34<1:29:10, 1.64it/s, loss=1.23]") == pytest.approx(1640)
    assert p(" 12%|█▏        | 1234/10000 [12:34<1:29:10,  3.20s/it, loss=1.23]") == pytest.approx(312.5)
    assert p("1234it [12:34, 1.64it/s]") == pytest.approx(1640)
    assert p("\x1b[A 5%|▌ | 50/1000 [00:10<03:10, 5.00it/s]") == pytest.approx(5000)
    assert p("50%|█████ | 5.00k/10.0k [00:10<00:10, 1.2kit/s]") == pytest.approx(1.2e6)
    for miss in [
        "  0%|          | 0/10000 [00:00<?, ?it/s]",
        "12%|█▏ | 12.3k/100k [00:05<00:40, 2.46ktok/s]",  # custom unit: ignored
        "loss=1.23 lr=3e-4",
        "12.8K tok/s",
        "0%| | 0/10 [00:00<?, 0.00s/it]",
    ]:
        assert p(miss) is None, miss


def test_hf():
    p = make_parser("hf")
    assert p("{'loss': 1.2, 'train_tokens_per_second': 12800.0, 'epoch': 0.1}") == 12800
    assert p("{'loss': 1.2, 'tokens_per_second': 4300.5}") == 4300.5
    assert p('{"loss": 1.2, "train_tokens_per_second": 12800.0}') == 12800
    assert p("{'train_tokens_per_second': np.float64(12800.0)}") == 12800
    assert p("{'train_tokens_per_second': 1.28e+04}") == 12800
    for miss in [
        "{'loss': 1.2, 'train_samples_per_second': 3.2, 'epoch': 0.1}",
        "{'train_tokens_per_second_per_gpu': 1600.0}",
        "tokens_per_second is slow",
        "12.8K tok/s",
    ]:
        assert p(miss) is None, miss


def test_regex():
    p = make_parser("regex", pattern=r"throughput=(?P<value>[\d,.]+)\s*(?P<unit>[KMGkmg]?)tok")
    assert p("iter 5 throughput=12,800 tok") == 12800
    assert p("iter 5 throughput=12.8Ktok") == 12800
    assert p("iter 5 throughput=1.2mtok") == pytest.approx(1.2e6)
    assert p("\x1b[1miter 5 throughput=4.3K\x1b[0mtok") == pytest.approx(4300)
    assert p("iter 5 loss=1.0") is None
    assert make_parser("regex", pattern=r"rate (?P<value>\d+)")("rate 40") == 40
    # unknown unit -> None; steps/s pattern × tokens_per_step
    assert make_parser("regex", pattern=r"(?P<value>\d+)(?P<unit>[a-z]*)/s")("12x/s") is None
    assert make_parser("regex", pattern=r"(?P<value>[\d.]+) steps/s", tokens_per_step=4096)("2.5 steps/s") == 10240


def test_make_parser_errors():
    with pytest.raises(ValueError):
        make_parser("nope")
    with pytest.raises(ValueError):
        make_parser("regex")
    with pytest.raises(ValueError):
        make_parser("regex", pattern=r"(\d+) tok/s")  # no 'value' group
    with pytest.raises(ValueError):
        make_parser("regex", pattern=r"(?P<value>")
    with pytest.raises(ValueError):
        make_parser("tqdm")  # needs tokens_per_step
    with pytest.raises(ValueError):
        make_parser("ktok", pattern=r"(?P<value>\d+)")
    with pytest.raises(ValueError):
        make_parser("ktok", tokens_per_step=10)
    with pytest.raises(ValueError):
        make_parser("ktok", scale=0)


def test_step_parsers():
    assert make_step_parser("torchtitan")(TT_LINE) == 10
    k = make_step_parser("ktok")
    assert k("step 10 | 12.8K tok/s") == 10
    assert k("Step=42 tok/s: 1K") == 42
    assert k("steps: 100") is None and k("step_time: 1.2") is None and k("12.8K tok/s") is None
    t = make_step_parser("tqdm")
    assert t("12%|█▏        | 1234/10000 [12:34<1:29:10, 1.64it/s]") == 1234
    assert t("1234it [12:34, 1.64it/s]") == 1234
    assert t("loss 1/2") is None
    h = make_step_parser("hf")
    assert h("{'loss': 1.0, 'step': 10}") == 10
    assert h('{"global_step": 7}') == 7
    assert h("{'loss': 1.0}") is None
    assert make_step_parser("regex", pattern=r"it (?P<step>\d+)")("it 5 ok") == 5
    assert make_step_parser("regex", pattern=r"(?P<value>\d+)")("it 5") is None
    assert make_step_parser("regex")("it 5") is None
    with pytest.raises(ValueError):
        make_step_parser("nope")


# ---------------------------------------------------------------- classify

SIGS = ["is_fx_symbolic_tracing", "undefined symbol: cuLaunch"]
TRACE = [
    "Traceback (most recent call last):",
    '  File "train.py", line 10, in <module>',
    "AttributeError: module 'torch.fx' has no attribute 'is_fx_symbolic_tracing'",
]
OOM = ["torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB."]


def test_classify_ok():
    assert classify_exit(0, None, TRACE, SIGS)[0] == "ok"


def test_classify_signature_wins():
    name, reason = classify_exit(1, None, TRACE + OOM, SIGS)
    assert name == "error_signature"
    assert "error signature 'is_fx_symbolic_tracing' in train.log" in reason
    assert classify_exit(137, None, ["\x1b[31mis_fx_symbolic_tracing\x1b[0m"], SIGS)[0] == "error_signature"
    assert "in out.log" in classify_exit(1, None, TRACE, SIGS, log_name="out.log")[1]


def test_classify_cuda_oom():
    for line in OOM + ["torch.cuda.OutOfMemoryError: x", "RuntimeError: CUDA out of memory."]:
        name, reason = classify_exit(1, None, ["step 1", line], SIGS)
        assert name == "cuda_oom" and "exit" in reason


def test_classify_oom_killed():
    for rc, sig in [(137, None), (-9, None), (None, 9), (137, 9)]:
        name, reason = classify_exit(rc, sig, ["step 1"], SIGS)
        assert name == "oom_killed", (rc, sig)
        assert "SIGKILL" in reason and "OOM killer" in reason
    assert classify_exit(137, None, [], SIGS)[1] == "killed by SIGKILL (exit 137), likely the OOM killer"


def test_classify_crash():
    name, reason = classify_exit(1, None, ["step 1", "RuntimeError: boom", ""], SIGS)
    assert name == "crash" and reason == "exited with code 1: RuntimeError: boom"
    assert classify_exit(139, None, [], SIGS) == ("crash", "killed by SIGSEGV (exit 139)")
    assert classify_exit(-11, None, [], SIGS)[1] == "killed by SIGSEGV (signal 11)"
    assert classify_exit(None, 15, [], SIGS)[0] == "crash"
    assert classify_exit(None, None, [], SIGS) == ("crash", "exit status unknown")
    assert classify_exit(2, None, ["usage: train.py"], [""])[1] == "exited with code 2: usage: train.py"


def test_scan_line_and_find_signature():
    assert scan_line("AttributeError: ... is_fx_symbolic_tracing", SIGS) == "error_signature"
    assert scan_line(OOM[0], SIGS) == "cuda_oom"
    assert scan_line("step 10 loss 1.0", SIGS) is None
    assert scan_line("anything", [""]) is None  # empty signature never matches
    assert find_signature(["a", "undefined symbol: cuLaunchKernel", TRACE[2]], SIGS) == "undefined symbol: cuLaunch"


# ---------------------------------------------------------------- policy


def mk(values, t0=0.0, dt=10.0):
    return [Sample(t0 + i * dt, float(v), step=i) for i, v in enumerate(values)]


def at_end(samples, dt=1.0):
    return samples[-1].t + dt


def Cfg(**kw):
    """The rules below predate the settle rule (tests/test_policy_time.py tests it): off here."""
    return PolicyConfig(**{"settle_samples": 0, **kw})


def test_threshold():
    assert threshold(Cfg(min=10_000), None) == (10_000, "min")
    v, src = threshold(Cfg(min_ratio=0.8), 12_800)
    assert v == pytest.approx(10_240) and src == "min_ratio 0.8 × baseline 12.8K"
    assert threshold(Cfg(min=11_000, min_ratio=0.8), 12_800) == (11_000, "min")
    assert threshold(Cfg(min=5_000, min_ratio=0.8), 12_800)[0] == pytest.approx(10_240)
    assert threshold(Cfg(min=5_000, min_ratio=0.8), None) == (5_000, "min")
    v, src = threshold(Cfg(min_ratio=0.8), None)
    assert v is None and "no baseline" in src
    assert threshold(Cfg(), 12_800)[0] is None


def test_warming_up_by_time_and_samples_ignored():
    cfg = Cfg(min=10_000, window=3, failure_limit=1, initial_delay=60)
    s = mk([100, 100, 100, 100, 100, 100, 12_800, 12_800, 12_800])  # t = 0..80, first 6 inside delay
    assert decide(cfg, s[:3], now=25, phase_start=0, baseline=None).verdict == "warming_up"
    d = decide(cfg, s, now=81, phase_start=0, baseline=None)
    assert d.verdict == "ok" and d.evidence["samples_considered"] == 3
    assert decide(cfg, s[:8], now=71, phase_start=0, baseline=None).verdict == "inconclusive"


def test_warming_up_by_sample_count():
    cfg = Cfg(min=10_000, window=3, failure_limit=1, initial_delay_samples=2)
    s = mk([1, 1, 12_800, 12_800, 12_800])
    assert decide(cfg, s[:1], now=1, phase_start=0, baseline=None).verdict == "warming_up"
    assert decide(cfg, s[:4], now=31, phase_start=0, baseline=None).verdict == "inconclusive"
    d = decide(cfg, s, now=41, phase_start=0, baseline=None)
    assert d.verdict == "ok" and d.evidence["window"] == [12_800] * 3


def test_samples_before_phase_start_ignored():
    cfg = Cfg(min=10_000, window=3, failure_limit=1)
    s = mk([1, 1, 1]) + mk([12_800] * 3, t0=100)
    assert decide(cfg, s, now=125, phase_start=100, baseline=None).verdict == "ok"


def test_single_bad_window_is_breach_not_rollback():
    cfg = Cfg(min=10_000, window=3, failure_limit=3)
    s = mk([12_800] * 5 + [4_300, 4_300])
    d = decide(cfg, s, now=at_end(s), phase_start=0, baseline=None)
    assert d.verdict == "breach"
    assert d.evidence["consecutive_breaches"] == 1
    assert "1 of 3 consecutive windows" in d.reason


def test_failure_limit_consecutive_is_rollback_with_evidence():
    cfg = Cfg(min=10_000, window=5, failure_limit=3)
    s = mk([12_800] * 10 + [4_300] * 7)
    d = decide(cfg, s, now=at_end(s), phase_start=0, baseline=None)
    assert d.verdict == "rollback"
    assert d.reason == "median 4.3K tok/s of last 5 samples < 10K tok/s (min) for 3 consecutive windows"
    ev = d.evidence
    assert ev["window"] == [4_300.0] * 5 and ev["median"] == 4_300
    assert ev["threshold"] == 10_000 and ev["threshold_source"] == "min"
    assert ev["consecutive_breaches"] == 3 and ev["failure_limit"] == 3
    assert ev["window_medians"] == [4_300] * 3
    assert ev["samples_considered"] == 17 and ev["last_sample_age"] == 1.0 and ev["last_step"] == 16
    json.dumps(ev)
    # a median breaches once 3 of 5 are low: with 4 low samples, 2 windows breach
    d2 = decide(cfg, s[:14], now=at_end(s[:14]), phase_start=0, baseline=None)
    assert d2.verdict == "breach" and d2.evidence["consecutive_breaches"] == 2


def test_recovery_resets_count():
    cfg = Cfg(min=10_000, window=3, failure_limit=3)
    s = mk([4_300] * 6)
    assert decide(cfg, s, now=at_end(s), phase_start=0, baseline=None).verdict == "rollback"
    s += mk([12_800] * 2, t0=s[-1].t + 10)
    d = decide(cfg, s, now=at_end(s), phase_start=0, baseline=None)
    assert d.verdict == "ok" and d.evidence["consecutive_breaches"] == 0
    s += mk([4_300] * 2, t0=s[-1].t + 10)
    assert decide(cfg, s, now=at_end(s), phase_start=0, baseline=None).verdict == "breach"


def test_median_ignores_single_spike():
    cfg = Cfg(min=10_000, window=5, failure_limit=1)
    s = mk([12_800, 12_800, 100, 12_800, 12_800])
    assert decide(cfg, s, now=at_end(s), phase_start=0, baseline=None).verdict == "ok"


def test_stall_is_not_low_throughput():
    cfg = Cfg(min=10_000, window=3, failure_limit=1, no_data_timeout=60, initial_delay=30)
    s = mk([12_800] * 7, t0=30)  # the delay counts from the first sample (t=30): 4 samples count
    d = decide(cfg, s, now=s[-1].t + 61, phase_start=0, baseline=None)
    assert d.verdict == "stall" and "consecutive_breaches" not in d.evidence
    assert d.evidence["no_data_for"] == 61
    assert decide(cfg, s, now=s[-1].t + 59, phase_start=0, baseline=None).verdict == "ok"
    # no samples at all: the clock starts when the initial delay ends
    assert decide(cfg, [], now=80, phase_start=0, baseline=None).verdict == "inconclusive"
    d = decide(cfg, [], now=91, phase_start=0, baseline=None)
    assert d.verdict == "stall" and "initial delay" in d.reason
    # stall wins over low values too
    low = mk([1] * 5, t0=30)
    assert decide(cfg, low, now=low[-1].t + 61, phase_start=0, baseline=None).verdict == "stall"
    # disabled
    off = Cfg(min=10_000, window=3, failure_limit=1, no_data_timeout=None)
    assert decide(off, s, now=1e9, phase_start=0, baseline=None).verdict == "ok"


def test_ratio_absolute_and_both():
    s = mk([9_000] * 5)
    now = at_end(s)
    ratio = Cfg(min_ratio=0.8, window=5, failure_limit=1)
    assert decide(ratio, s, now, 0, baseline=12_800).verdict == "rollback"  # 9K < 10.24K
    assert decide(ratio, s, now, 0, baseline=10_000).verdict == "ok"  # 9K >= 8K
    absolute = Cfg(min=8_000, window=5, failure_limit=1)
    assert decide(absolute, s, now, 0, baseline=12_800).verdict == "ok"
    both = Cfg(min=8_000, min_ratio=0.8, window=5, failure_limit=1)
    d = decide(both, s, now, 0, baseline=12_800)
    assert d.verdict == "rollback" and "min_ratio 0.8 × baseline 12.8K" in d.reason
    assert decide(both, s, now, 0, baseline=None).verdict == "ok"  # only min applies


def test_min_ratio_without_baseline_is_inconclusive():
    cfg = Cfg(min_ratio=0.8, window=3)
    s = mk([1] * 10)
    d = decide(cfg, s, now=at_end(s), phase_start=0, baseline=None)
    assert d.verdict == "inconclusive" and "no baseline" in d.reason


def test_decide_reads_only_the_tail():
    class Spy(list):
        reads = 0

        def __getitem__(self, i):
            if isinstance(i, slice):
                lo, hi, _ = i.indices(len(self))
                self.reads += hi - lo
            else:
                self.reads += 1
            return list.__getitem__(self, i)

    s = Spy(mk([12_800] * 100_000))
    cfg = Cfg(min=10_000, window=5, failure_limit=3, initial_delay=5)
    assert decide(cfg, s, now=at_end(s), phase_start=0, baseline=None).verdict == "ok"
    assert s.reads < 80  # 3 binary searches (phase start, delay end, judging start) + window + limit, not n


def test_known_good():
    cfg = Cfg(min_ratio=0.8, window=3, good_after=100, initial_delay=20)
    s = mk([100] * 2 + [12_800] * 15)  # t 0..160; first counted at t=20
    assert known_good(cfg, s, now=100, phase_start=0, baseline=None) is None  # too early
    assert known_good(cfg, s[:12], now=200, phase_start=0, baseline=None) is None  # no sample reaches t=120 yet
    assert known_good(cfg, s, now=200, phase_start=0, baseline=None) == 12_800  # first baseline
    assert known_good(cfg, s, now=200, phase_start=0, baseline=12_800) == 12_800
    # a breaching window inside the span spoils it, even with a good tail
    bad = mk([12_800] * 5 + [4_000] * 3 + [12_800] * 10)
    assert known_good(Cfg(min=10_000, window=3, good_after=100), bad, 300, 0, None) is None
    # ... but one outside the span (after it) does not
    late = mk([12_800] * 12 + [4_000] * 3)
    assert known_good(Cfg(min=10_000, window=3, good_after=100), late, 300, 0, None) == 12_800
    # a gap longer than no_data_timeout inside the span
    gap = mk([12_800] * 3) + mk([12_800] * 10, t0=100)
    cfg2 = Cfg(min=10_000, window=3, good_after=100, no_data_timeout=60)
    assert known_good(cfg2, gap, 300, 0, None) is None


def test_config_validation():
    with pytest.raises(ValueError):
        Cfg(window=0)
    with pytest.raises(ValueError):
        Cfg(min_ratio=0)
    with pytest.raises(ValueError):
        Cfg(initial_delay=-1)


def test_decision_is_frozen():
    d = Decision("ok", "x", {})
    with pytest.raises(Exception):
        d.verdict = "rollback"


# ---------------------------------------------------------------- formatting


@pytest.mark.parametrize(
    "v,want",
    [
        (12_800, "12.8K"),
        (4_300, "4.3K"),
        (1_200_000, "1.2M"),
        (950, "950"),
        (10_000, "10K"),
        (123_456, "123K"),
        (999_960, "1M"),
        (999.96, "1K"),
        (9.5, "9.5"),
        (0, "0"),
        (2.5e9, "2.5G"),
        (-4_300, "-4.3K"),
    ],
)
def test_fmt_rate(v, want):
    assert fmt_rate(v) == want


def test_sparkline():
    assert sparkline([]) == ""
    assert sparkline([1, 2, 3, 4, 5, 6, 7, 8]) == "▁▂▃▄▅▆▇█"
    assert sparkline([5, 5, 5]) == "▄▄▄"
    assert sparkline([12_800, 4_300, 12_800]) == "█▁█"
    long = sparkline(list(range(1000)), width=40)
    assert len(long) == 40 and long[0] == "▁" and long[-1] == "█"
    assert len(sparkline([1.0, 2.0], width=40)) == 2  # never stretched
    assert sparkline([1, float("nan"), 2]) == "▁█"


@pytest.mark.parametrize("line,name", [
    ("[rank3]:[E] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=9)", "nccl_timeout"),
    ("NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.", "hw_error"),
    ("RuntimeError: CUDA error: uncorrectable ECC error encountered", "hw_error"),
    ("Failed to initialize NVML: Driver/library version mismatch", "driver_mismatch"),
    ("RuntimeError: The NVIDIA driver on your system is too old (CUDA driver version is insufficient)",
     "driver_mismatch"),
])
def test_classify_exit_names_the_failures_a_restart_policy_tells_apart(line, name):
    got, reason = classify_exit(1, None, ["step 9", line], [])
    assert got == name and line[:40] in reason
