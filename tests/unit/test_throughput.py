
import pytest

from gpujob.agent.judge.throughput import (LineSplitter, fmt_rate, make_parser, make_step_parser, sparkline,
                                           strip_ansi)

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
    assert make_parser("regex", pattern=r"(?P<value>[\d.]+) steps/s",
                       tokens_per_step=4096)("2.5 steps/s") == 10240


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
