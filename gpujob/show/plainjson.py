"""``print_json``: what rich's ``Console.print_json`` writes, without building its
highlighted text where nobody sees the highlighting (a piped console)."""

from __future__ import annotations

import json
import sys

from rich.console import Console


def print_json(con: Console, text: str) -> None:
    """``con.print_json(text)``, written at once when ``con`` is plain (not a terminal, no
    colour, nothing recorded or captured): rich then prints exactly ``json.dumps(…, indent=2,
    ensure_ascii=False)`` and a newline (tests/unit/test_print_json.py), and building its
    highlighted text costs ~2 ms a row of ``ps --json``, more than asking the host."""
    if con.is_terminal or con.color_system or con.record or con.is_jupyter or sys.platform == "win32" \
            or getattr(con, "_buffer_index", 1) != 0:
        con.print_json(text)
        return
    if con.quiet:
        return
    with con._lock:
        con.file.write(json.dumps(json.loads(text), indent=2, ensure_ascii=False) + "\n")
        con.file.flush()
