"""The ledger as a store (issue 39), fast and without the bed: the migration of today's file
(format 1) with its history kept, each damaged form refused with one line and its bytes kept,
the recovery, undo refused when a later verdict superseded it, ids never reused, temp files of
dead writers removed, a writer that cannot get the lock in time, pick among the spec's profiles."""

from __future__ import annotations

import json
import os

import pytest

from gpujob.agent.home import ledgerfile
from gpujob.agent.home.journal import Home
from gpujob.agent.home.ledger import Ledger, Superseded
from gpujob.agent.home.ledgerfile import Damaged
from gpujob.agent.judge.decide import pick, unlisted_goods

# a ledger as gpujob wrote it before the lock (format 1: no format key), with its history
TODAY = {"profiles": {"fast": {"status": "good", "at": 100.0, "baseline": 9000.0, "job": "j1"},
                      "slow": {"status": "bad", "at": 200.0, "reason": "median 4K < 10K", "job": "j2"}},
         "history": [{"id": 1, "profile": "fast", "status": "good", "time": 100.0, "before": None,
                      "job": "j1", "baseline": 9000.0, "window_medians": None, "threshold": None},
                     {"id": 2, "profile": "slow", "status": "bad", "time": 200.0, "before": None,
                      "reason": "median 4K < 10K", "job": "j2", "window_medians": [4000.0],
                      "threshold": 10000.0}],
         "next_id": 3, "last_good": "fast"}


def ledger_at(tmp_path, text: str | None = None, name: str = "tjob") -> Ledger:
    (tmp_path / "ledger").mkdir(exist_ok=True)
    if text is not None:
        (tmp_path / "ledger" / f"{name}.json").write_text(text)
    return Ledger(Home(str(tmp_path)), name)


def test_todays_ledger_is_migrated_once_with_its_history_and_ids_going_on(tmp_path):
    led = ledger_at(tmp_path, json.dumps(TODAY))
    assert led.status("slow") == "bad" and [h["id"] for h in led.history()] == [1, 2]
    led.mark("mid", "good", reason="held")
    on_disk = json.loads((tmp_path / "ledger" / "tjob.json").read_text())
    assert on_disk["format"] == ledgerfile.FORMAT and [h["id"] for h in on_disk["history"]] == [1, 2, 3]
    assert (on_disk["history"][1]["window_medians"] == [4000.0]
            and on_disk["profiles"]["fast"]["baseline"] == 9000.0)
    assert json.loads((tmp_path / "ledger" / "tjob.json.v1").read_text()) == TODAY  # today's bytes, kept once
    led.mark("mid", "bad")
    assert json.loads((tmp_path / "ledger" / "tjob.json.v1").read_text()) == TODAY
    copy = json.loads((tmp_path / "ledger" / "tjob.json.last-good").read_text())
    assert copy == json.loads((tmp_path / "ledger" / "tjob.json").read_text())


DAMAGED = {
    "truncated": json.dumps(TODAY)[:70],
    "garbage": "\x00\x01 not json at all {{{",
    "empty": "",
    "profiles a list": '{"profiles": []}',
    "top a list": "[1, 2]",
    "status unknown": '{"profiles": {"fast": {"status": "great"}}}',
    "history odd": '{"profiles": {}, "history": [{"id": "x"}]}',
    "a name that ends a line": '{"profiles": {"fast\\nrm -rf": {"status": "good"}}}',
    "format 99": '{"format": 99, "profiles": {}}',
    "nested too deep": '{"profiles": ' + "[" * 200000,
    "not a number": '{"profiles": {"fast": {"status": "good", "baseline": NaN}}}',
}


@pytest.mark.parametrize("form", sorted(DAMAGED))
def test_a_damaged_ledger_is_refused_in_one_line_and_nothing_is_written_over_it(tmp_path, form):
    led = ledger_at(tmp_path, DAMAGED[form])
    path = tmp_path / "ledger" / "tjob.json"
    before = path.read_bytes()
    for act in (led.read, lambda: led.mark("slow", "good"), lambda: led.forget("slow"), led.history,
                lambda: led.undo("1"), lambda: led.note("slow", x=1)):
        with pytest.raises(Damaged) as e:
            act()
        line = str(e.value)
        assert "\n" not in line and str(path) in line and "gpujob ledger recover" in line
    assert path.read_bytes() == before
    if form == "format 99":
        assert "newer than this gpujob knows" in line


def test_a_link_a_fifo_and_a_hard_link_are_refused_without_being_opened(tmp_path):
    led = ledger_at(tmp_path)
    path = tmp_path / "ledger" / "tjob.json"
    other = ledger_at(tmp_path, json.dumps(TODAY), name="other")
    os.symlink("/dev/zero", path)
    with pytest.raises(Damaged, match="symbolic link"):
        led.read()
    os.unlink(path)
    os.symlink(other.path, path)  # another ledger's verdicts are never imported
    with pytest.raises(Damaged, match="symbolic link"):
        led.mark("x", "good")
    assert os.readlink(path) == other.path and json.loads(open(other.path).read()) == TODAY
    os.unlink(path)
    os.mkfifo(path)  # nobody writes it: a blocking open would hang
    with pytest.raises(Damaged, match="FIFO"):
        led.history()
    assert os.path.exists(path) and not os.path.isfile(path)
    os.unlink(path)
    os.link(other.path, path)
    with pytest.raises(Damaged, match="hard links"):
        led.read()


def test_the_supervisor_is_told_and_goes_on_while_a_hand_verb_is_refused(tmp_path):
    said = []
    (tmp_path / "ledger").mkdir()
    (tmp_path / "ledger" / "tjob.json").write_text("garbage")
    led = Ledger(Home(str(tmp_path)), "tjob", report=said.append)
    assert (led.read() == {"profiles": {}} and led.mark("slow", "bad") is None
            and led.status("slow") == "untried")
    assert len(said) == 1 and "does not parse" in said[0]  # said once
    assert (tmp_path / "ledger" / "tjob.json").read_text() == "garbage"


def test_recover_keeps_the_damaged_file_and_restores_the_last_good_copy_ids_never_reused(tmp_path):
    led = ledger_at(tmp_path)
    for i in range(3):
        led.mark(f"p{i}", "good")
    path = tmp_path / "ledger" / "tjob.json"
    path.write_text('{"history": [{"id": 41}], "profiles": ')  # torn, with an id beyond the copy's
    res = led.recover()
    kept = tmp_path / "ledger" / os.path.basename(res["kept_as"])
    assert (kept.read_text().startswith('{"history": [{"id": 41}]')
            and res["restored_from"] == "tjob.json.last-good")
    assert [h["id"] for h in led.history()] == [1, 2, 3] and res["next_id"] == 42
    led.mark("p9", "bad")
    assert led.history()[-1]["id"] == 42
    with pytest.raises(ledgerfile.LedgerError, match="reads well"):
        led.recover()
    os.unlink(led.path)  # a reset by hand: a fresh ledger, its ids still after every earlier one
    led.mark("p0", "good")
    assert [h["id"] for h in led.history()] == [43]


def test_undo_refuses_a_verdict_superseded_by_a_later_one_on_the_same_profile(tmp_path):
    led = ledger_at(tmp_path)
    led.mark("fast", "good")
    led.mark("fast", "bad", reason="odd")
    led.mark("slow", "bad")
    with pytest.raises(Superseded) as e:
        led.undo("1")
    assert e.value.args[0]["id"] == 2
    assert led.status("fast") == "bad"  # the later verdict stands
    led.undo("3")
    assert led.status("slow") == "untried"
    with pytest.raises(Superseded):  # undone already: its undo (4) stands in the way
        led.undo("3")
    led.undo("2")
    assert led.status("fast") == "good"
    assert [h["id"] for h in led.history()] == [1, 2, 3, 4, 5]


def test_the_temp_files_of_dead_writers_go_at_the_next_write(tmp_path):
    led = ledger_at(tmp_path)
    led.mark("fast", "good")
    for n in ("tjob.json.tmpab12cd", "tjob.json.last-good.tmpzz"):
        (tmp_path / "ledger" / n).write_text("half")
    (tmp_path / "ledger" / "other.json.tmpkeep").write_text("another name's")
    led.mark("slow", "bad")
    assert sorted(os.listdir(tmp_path / "ledger")) == ["other.json.tmpkeep", "tjob.json",
                                                       "tjob.json.last-good", "tjob.lock"]


def test_pick_rolls_back_to_the_newest_known_good_profile_the_spec_lists():
    ledger = {"profiles": {"fast": {"status": "good", "at": 10.0}, "nightly": {"status": "good", "at": 20.0},
                           "slow": {"status": "untried"}}}
    assert pick(ledger, "slow", ["fast", "slow"], []) == "fast"
    assert unlisted_goods(ledger, ["fast", "slow"]) == ["nightly"]
    assert pick(ledger, "fast", ["fast", "slow"], []) is None


def test_gc_removes_no_venv_while_a_ledger_cannot_be_read(tmp_path):
    from gpujob.agent.home import gc
    ledger_at(tmp_path, json.dumps(TODAY))
    ledger_at(tmp_path, "garbage", name="broken")
    ledgers, damaged = gc.read_ledgers(str(tmp_path / "ledger"))
    assert list(ledgers) == ["tjob"] and len(damaged) == 1 and "broken.json" in damaged[0]
    envs = [{"env_key": "old-1", "profile": "old", "last_used": 0.0}]
    assert gc.select(envs, 1, 10 * 86400, set(), set(), set())[0][1] == "remove"
    assert gc.select(envs, 1, 10 * 86400, set(), set(), set(), hold="kept: x")[0][1] == "kept: x"


def _mutants(base: dict, rng) -> list:
    """Ledgers one value away from ``base``: each value (at any depth) replaced by another type."""
    odd = [None, True, 0, -1, 1e308, 10 ** 400, "x", "", [], [1, "a"], {}, {"status": "good"}, "good", "\n",
           "[bold]x"]
    paths = []

    def walk(v, path):
        paths.append(path)
        if isinstance(v, dict):
            for k, x in v.items():
                walk(x, path + (k,))
        elif isinstance(v, list):
            for i, x in enumerate(v):
                walk(x, path + (i,))
    walk(base, ())
    out = []
    for path in paths[1:]:
        for new in rng.sample(odd, 4):
            led = json.loads(json.dumps(base))
            cur = led
            for k in path[:-1]:
                cur = cur[k]
            cur[path[-1]] = new
            out.append(led)
    return out


def test_no_ledger_that_passes_the_checks_crashes_a_reader(tmp_path):
    """Every value of a real ledger replaced by another type: either refused (one line) or
    read, shown, decided on and written without an exception."""
    import random
    from gpujob.agent.home import gc
    from gpujob.show import render
    base = json.loads(json.dumps(TODAY))
    base["profiles"]["fast"].update(proof="cold", env_key="fast-1", reason="held")
    base["history"][1]["before"] = {"status": "good", "at": 1.0, "baseline": 5.0}
    refused = read = 0
    for i, led_data in enumerate(_mutants(base, random.Random(39))):
        led = ledger_at(tmp_path, json.dumps(led_data), name=f"m{i}")
        try:
            led.read()
        except Damaged as e:
            assert "\n" not in str(e)
            refused += 1
            continue
        read += 1
        data = led.read()
        render.ledger_table(data["profiles"])
        render.profiles_table({"ledgers": {"m": data}, "envs": []}, "box")
        for h in led.history():
            render.ledger_history_line(h)
        pick(data, "slow", ["fast", "slow"], ["fast"])
        gc.protected_by_ledgers({"m": data})
        led.status("fast"), led.baseline("fast"), led.last_good(), Ledger.ever_good(data)
        for h in led.history():
            try:
                led.undo(str(h["id"]))
            except Superseded:
                pass
        led.mark("slow", "good", baseline=1.0)
    assert refused > 10 and read > 10, (refused, read)
