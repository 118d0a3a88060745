"""Issue 22, item 5: throughput lines real trainers print (time per step, the regex's
step group, per-rank prefixes)."""

import pytest

from gpujob.agent.judge import sources
from gpujob.agent.base import defaults
from gpujob.agent.judge.ranks import RankMerge, split_rank
from gpujob.agent.judge.throughput import make_parser
from gpujob.spec.model import JobSpec  # noqa: F401  (the spec model validates the section)
from gpujob.spec.throughput import Throughput

NANOGPT = r"iter (?P<step>\d+): loss [\d.]+, time (?P<ms>[\d.]+)ms"


def tp(**kw):
    return {**defaults.DEFAULTS["throughput"], **kw}


def test_nanogpt_time_per_iter_gives_tokens_over_time():
    src = sources.line_source(tp(format="regex", pattern=NANOGPT, tokens_per_step=491520))
    value, step = src.from_line("iter 120: loss 3.2101, time 52.1ms, mfu 55.3%")
    assert value == pytest.approx(491520 / 0.0521) and step == 120
    secs = make_parser("regex", pattern=r"(?P<seconds>[\d.]+)\s*s/iter", tokens_per_step=1000)
    assert secs("2.5 s/iter") == pytest.approx(400)
    k = make_parser("regex", pattern=r"(?P<ms>[\d.]+)ms (?P<unit>K)?", tokens_per_step=10)
    assert k("10ms K") == pytest.approx(1e6)
    assert make_parser("regex", pattern=NANOGPT, tokens_per_step=1)("iter 1: loss 1, time 0ms") is None


def test_regex_step_group_is_read_by_the_supervisors_source():
    src = sources.line_source(tp(format="regex", pattern=r"step (?P<step>\d+) rate (?P<value>[\d.]+)"))
    assert src.from_line("step 42 rate 1000") == (1000.0, 42)


def test_rank_prefixes():
    assert split_rank("[rank3]: step 1 12.8K tok/s") == (3, "step 1 12.8K tok/s")
    assert split_rank("[default0]:x") == (0, "x")
    assert split_rank("rank 7: x") == (7, "x")
    assert split_rank("x [rank3]: y") == (None, "x [rank3]: y")


@pytest.mark.parametrize("how,expect", [("first", [1000.0, 1000.0]), ("sum", [8 * 1000 + 28, 8 * 1000 + 28]),
                                        ("min", [1000.0, 1000.0])])
def test_eight_ranks_one_sample_per_step(how, expect):
    src = sources.line_source(tp(format="ktok", ranks=how))
    got = []
    for step in (1, 2):
        for r in range(8):
            out = src.from_line(f"[rank{r}]: step {step} {1000 + r} tok/s")
            if out is not None:
                got.append(out)
    if how == "sum":  # the first step is emitted when the second starts, the second at once (world learned)
        assert got == [(8028.0, 1), (8028.0, 2)]
    else:
        assert [v for v, _ in got] == expect and [s for _, s in got] == [1, 2]


def test_ranks_without_step_end_an_interval_when_a_rank_repeats():
    m = RankMerge("min")
    outs = [m.add(r, v, None) for r, v in [(0, 5.0), (1, 3.0), (0, 6.0), (1, 7.0), (0, 1.0)]]
    assert outs == [None, None, (3.0, None), (6.0, None), None]


def test_sum_with_per_gpu_refused():
    with pytest.raises(Exception, match="count every GPU twice"):
        Throughput(format="ktok", min=1, ranks="sum", scope="per_gpu")
    with pytest.raises(Exception, match="tokens_per_step"):
        Throughput(format="regex", min=1, pattern=NANOGPT)
