"""The house rule on time: no test asserts a duration or a rate read from the clock, so the
suite passes on a loaded 2-core machine (tests/README.md). A test asserts what the time
stood for (the order of events, a count, a state reached, that a call returned at all
under helpers.returns' hang guard); a speed goal is a benchmark's (bench/, BENCHMARKS.md).

Held here on every test file: an ``assert`` may not order (<, <=, >, >=) a clock reading
(``time.monotonic()``, ``time.time()``, ``time.perf_counter()``), a call of the module's
own timer (a function that returns a difference of clock readings), a name the same
function set from such a difference (``took = time.monotonic() - t0``), or a measured
duration of gpujob's (a command's ``.duration``, a record's ``["took"]``). Deadlines in
loops, clock values handed to the code under test, and equalities are not checks of speed
and are left alone."""

from __future__ import annotations

import ast
from pathlib import Path

from helpers import REPO

CLOCKS = {"monotonic", "time", "perf_counter", "monotonic_ns", "time_ns", "perf_counter_ns"}
ORDER = (ast.Lt, ast.LtE, ast.Gt, ast.GtE)
MEASURED = {"duration", "took"}  # gpujob's measured wall times: Result.duration, a rollback's took


def _is_clock(node: ast.AST, timers: frozenset = frozenset()) -> bool:
    """``time.monotonic()`` and its kind (also called as a bare imported name), or a call of
    one of ``timers``."""
    if not isinstance(node, ast.Call):
        return False
    f = node.func
    if isinstance(f, ast.Attribute):
        return f.attr in CLOCKS and isinstance(f.value, ast.Name) and f.value.id == "time"
    return isinstance(f, ast.Name) and (f.id in CLOCKS - {"time"} or f.id in timers)


def _reads_clock(node: ast.AST, timers: frozenset = frozenset()) -> bool:
    return any(_is_clock(n, timers) for n in ast.walk(node))


def _differences(node: ast.AST) -> list[ast.AST]:
    return [b for b in ast.walk(node) if isinstance(b, ast.BinOp) and isinstance(b.op, ast.Sub)]


def _timers(tree: ast.AST) -> frozenset:
    """The module's functions that return a difference of clock readings (``_timed(fn)``)."""
    fns = [fn for fn in ast.walk(tree) if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef))]
    return frozenset(fn.name for fn in fns
                     if any(isinstance(r, ast.Return) and r.value is not None and
                            any(_reads_clock(b) for b in _differences(r.value)) for r in ast.walk(fn)))


def _elapsed_names(fn: ast.AST, timers: frozenset) -> set[str]:
    """Names set in ``fn`` from a subtraction that reads the clock (an elapsed time), or from a timer."""
    names = set()
    for n in ast.walk(fn):
        if isinstance(n, (ast.Assign, ast.AugAssign, ast.AnnAssign)) and n.value is not None:
            if any(_reads_clock(b) for b in _differences(n.value)) or \
                    any(_is_clock(c, timers) for c in ast.walk(n.value) if not _is_clock(c)):
                targets = n.targets if isinstance(n, ast.Assign) else [n.target]
                names |= {t.id for t in targets if isinstance(t, ast.Name)}
    return names


def _measured(node: ast.AST, elapsed: set, timers: frozenset) -> bool:
    for n in ast.walk(node):
        if _is_clock(n, timers) or (isinstance(n, ast.Name) and n.id in elapsed) or \
                (isinstance(n, ast.Attribute) and n.attr in MEASURED) or \
                (isinstance(n, ast.Subscript) and isinstance(n.slice, ast.Constant) and
                 n.slice.value in MEASURED):
            return True
    return False


def timing_asserts(source: str) -> list[tuple[int, str]]:
    """(line, text) of each assert in ``source`` that orders a clock reading or a duration."""
    tree = ast.parse(source)
    timers = _timers(tree)
    found = []
    for fn in ast.walk(tree):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        elapsed = _elapsed_names(fn, timers)
        for a in ast.walk(fn):
            if isinstance(a, ast.Assert) and any(
                    isinstance(c, ast.Compare) and any(isinstance(op, ORDER) for op in c.ops) and
                    any(_measured(side, elapsed, timers) for side in (c.left, *c.comparators))
                    for c in ast.walk(a.test)):
                found.append((a.lineno, ast.get_source_segment(source, a) or ""))
    return sorted(set(found))


def test_no_test_asserts_a_duration():
    bad = []
    for path in sorted((REPO / "tests").rglob("*.py")):
        if "data" in path.relative_to(REPO / "tests").parts:
            continue
        for line, text in timing_asserts(path.read_text()):
            bad.append(f"{path.relative_to(REPO)}:{line}: {text.splitlines()[0]}")
    assert not bad, ("a test asserts a duration (tests/README.md: assert what the time stood for, "
                     "or measure it in bench/):\n" + "\n".join(bad))


def test_the_guard_sees_each_way_a_duration_is_asserted_and_leaves_the_rest():
    """The guard can fail: each form it is meant to catch, and the clock uses it must let be."""
    caught = '''
def a():
    t0 = time.monotonic()
    work()
    assert time.monotonic() - t0 < 5
def b():
    t0 = time.monotonic()
    work()
    took = time.monotonic() - t0
    assert p.returncode == 0 and took < 20, took
def c():
    r = run(timeout=0.5)
    assert r.timed_out and r.duration < 10
def d():
    t0 = perf_counter()
    assert 0.25 <= perf_counter() - t0
def _timed(fn):
    t0 = time.monotonic()
    fn()
    return time.monotonic() - t0
def e():
    assert _timed(lambda: w.wait(1.0)) < 5.0
    took = _timed(lambda: w.wait(1.0))
    assert took >= 0.25
    assert rb["took"] < 5
'''
    assert [line for line, _ in timing_asserts(caught)] == [5, 10, 13, 16, 22, 24, 25]
    let_be = '''
def a():
    end = time.monotonic() + 10
    while not done() and time.monotonic() < end:
        pass
    assert done()
def b():
    assert w.poll(time.time() + 1) == []
    assert ask(begun, time.monotonic() + 60) is None
def c():
    assert st["uptime_s"] >= 0 and len(rows) < 5
'''
    assert timing_asserts(let_be) == []


def test_the_tests_readme_states_the_rule():
    text = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    assert "No test asserts a duration or a rate" in text and "test_house_clock.py" in text
