"""``render.print_json`` writes what rich's ``Console.print_json`` writes, byte for byte,
on a plain console (piped: the CLI's and the kept connection's), and leaves a terminal's,
a recording or a capturing console to rich."""

from __future__ import annotations

import io
import json

import pytest
from rich.console import Console

from gpujob.show import plainjson, render

VALUES = [[], {}, 0, "s", None, [{"job_id": "j-1", "state": "succeeded", "reason": "exit 3 ü 日本語 " * 40,
                                 "tab\there": "\x1b[31mred\x7f \u2028 \u00a0", "n": 1.5e-7, "big": 10 ** 30,
                                 "nested": {"a": [True, False, None, {}, []]}}]]


@pytest.mark.parametrize("tty,columns", [(False, None), (False, "20"), (False, "200")])
def test_a_plain_console_gets_riches_bytes(tty, columns):
    env = {"COLUMNS": columns} if columns else {}
    for value in VALUES:
        text = json.dumps(value)
        a, b = io.StringIO(), io.StringIO()
        Console(file=a, **render.console_settings(tty, env)).print_json(text)
        plainjson.print_json(Console(file=b, **render.console_settings(tty, env)), text)
        assert a.getvalue() == b.getvalue()


def test_a_terminal_a_recording_and_a_capturing_console_are_riches():
    text = json.dumps(VALUES)
    for kw in ({"force_terminal": True, "color_system": "truecolor"}, {"record": True}):
        a, b = io.StringIO(), io.StringIO()
        Console(file=a, **kw).print_json(text)
        con = Console(file=b, **kw)
        plainjson.print_json(con, text)
        assert a.getvalue() == b.getvalue()
    con = Console(file=io.StringIO())
    with con.capture() as cap:
        plainjson.print_json(con, text)
    assert cap.get() and con.file.getvalue() == ""
    quiet = Console(file=io.StringIO(), quiet=True)
    plainjson.print_json(quiet, text)
    assert quiet.file.getvalue() == ""
