"""The supervisor's per-line and per-sample shortcuts (issue 33 item 2: <= 1 % of a core at
1,000 lines/s) give exactly what the long way gave: the ktok parse's search from the number
before the first "tok", the candidate lines found by ``str.find`` over a read's text, and the
samples.jsonl record built as one string. Each is checked against the long way on lines made
to trip it (case, non-ASCII, numbers of every form, several "tok" on a line)."""

from __future__ import annotations

import json
import os
import random

import pytest

from gpujob.agent.base.protocol import Verdict
from gpujob.agent.home.journal import _SORTED, sample_line
from gpujob.agent.judge import throughput
from gpujob.agent.judge.sources import lines_holding
from gpujob.agent.judge.textpat import strip_ansi

PIECES = ["12.8K", "20", "1,234", "12,800", "1.2e4", ".5", "3e-4", "K", "k", "M", "g", " ", "  ", "\t",
          "tok/s", "TOK/S", "Tok/s", "tokens/sec", "tokens/s", "tok", "toks", "tok/step", "tok/s/gpu",
          "tok/s:", "tok/s=", ":", "=", "/", ".", ",", "step", "|", "loss", "x", "a1", "v2.", "\u017f",
          "\u212a", "\u0130", "\x1b[32m", "\x1b[0m", "1733358000.123456", "-", "+", "e", "E", "ſ"]


def lines(seed: int, n: int) -> list:
    rng = random.Random(seed)
    return ["".join(rng.choice(PIECES) for _ in range(rng.randint(0, 9))) for _ in range(n)]


def old_ktok(line: str):
    """The ktok parse before the shortcut: the regex over the whole line."""
    text = strip_ansi(line)
    if "tok" not in text.lower():
        return None
    m = throughput._KTOK.search(text)
    if not m:
        return None
    value, unit = (m.group(1), m.group(2)) if m.group(1) else (m.group(3), m.group(4))
    return throughput._finite(throughput._num(value) * throughput._SUFFIX[(unit or "").lower()])


def test_the_ktok_parse_from_the_number_before_the_first_tok_finds_what_the_whole_line_search_found():
    parse = throughput.make_parser("ktok")
    got = lines(1, 20000) + ["1733358000.1 step 7 | 12.8K tok/s", "12 tok 3 tok/s", "1,234,567.5e3 k tok/s",
                             "tok 5 tok/s: 9", "x12.8K tok/s 7 tok/s", "\u0130 12K tok/s", "9 \u212atok/s"]
    hits = 0
    for line in got:
        want = old_ktok(line)
        assert parse(line) == want, line
        hits += want is not None
    assert hits > 300  # the fuzz reaches the matches, not only the misses


def old_candidates(lines_, lower: bool, needles) -> list:
    return [i for i, line in enumerate(lines_)
            if any(n in (line.lower() if lower else line) for n in needles)]


@pytest.mark.parametrize("lower,needles", [(True, ("tok",)), (True, ("tp", "wp")), (False, ("it/s", "s/it")),
                                           (False, ("tokens_per_second",))])
def test_candidate_lines_found_over_the_whole_read_are_the_lines_tested_one_by_one(lower, needles):
    for seed in range(300):
        batch = lines(seed, 40) + ["TP wp tok it/s/it", "", "tokens_per_second tok", "\u0130tok\u03a3"]
        random.Random(seed).shuffle(batch)
        whole = "\n".join(batch)
        whole = whole.lower() if lower else whole
        assert lines_holding(whole, needles) == old_candidates(batch, lower, needles), batch


@pytest.mark.parametrize("rec", [
    dict(t=1733358000.123, value=61234.5, step=1234, verdict=Verdict.OK, median=61000.0, profile="fast"),
    dict(t=1.0, value=7, step=None, verdict=Verdict.ROLLBACK, median=None, profile=None),
    dict(t=1e300, value=1e-7, step=0, verdict="paused", median=0.0, profile='fa"s\u00e9t\n'),
    dict(t=-0.0, value=2 ** 70, step=-3, verdict=Verdict.BREACH, median=12.5, profile=""),
])
def test_the_sample_record_built_as_one_string_is_the_sorted_encoders(rec):
    assert sample_line(dict(rec)) == _SORTED.encode(dict(rec, type="sample"))


@pytest.mark.parametrize("rec", [
    dict(t=1.0, value=float("inf"), step=1, verdict="ok", median=1.0, profile="p"),
    dict(t=1.0, value=float("nan"), step=1, verdict="ok", median=1.0, profile="p"),
    dict(t=1.0, value=1.0, step=True, verdict="ok", median=1.0, profile="p"),
    dict(t=1.0, value=1.0, step=1, verdict="reported", profile="p"),  # a fleet follower's: five keys
    dict(t=1.0, value=1.0, step=1, verdict=None, median=1.0, profile="p"),
])
def test_any_other_sample_record_goes_the_long_way_with_the_same_bytes(tmp_path, rec):
    from gpujob.agent.home.journal import Home, Journal
    assert sample_line(dict(rec)) is None
    home = Home(str(tmp_path))
    os.makedirs(home.job_dir("j"))
    j = Journal(home, "j")
    assert j.sample(**rec) == 0
    assert j.sample(False, **rec) is None
    data = open(j.path("samples.jsonl")).read().splitlines()
    assert data == [_SORTED.encode(dict(rec, type="sample"))] * 2
    assert json.loads(data[0].replace("Infinity", "1e999").replace("NaN", "0"))["type"] == "sample"
