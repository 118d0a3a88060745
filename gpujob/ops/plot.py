"""``gpujob plot``'s body: the job's events.jsonl and samples.jsonl read through the agent
(``tail``, as ``logs --events`` reads them), turned into series (show/plotdata.py, pure), then
written to a file or drawn in the terminal (show/plot.py)."""

from __future__ import annotations

import json
from pathlib import Path

from gpujob.agent.base import jsonl
from gpujob.errors import InputError
from gpujob.ops.follow import follow_log
from gpujob.show import plotdata, render
from gpujob.show.plot import FORMATS, terminal, write_file


def read_jsonl(t, job_id: str, file: str) -> list[dict]:
    """Every whole record of a job's JSONL file (a torn or trimmed-away line is skipped)."""
    r, got = jsonl.Records(file, strict=False), []  # bounded: a line too long or too deep is passed over
    follow_log(t, job_id, file=file, follow=False, write=lambda c: got.extend(r.feed(c)),
               notice=lambda m: None)
    return [rec for _n, rec in got + r.close()]


def command(job_id: str, t, st: dict, output: Path | None, as_json: bool, out) -> None:
    if output is not None and output.suffix.lower() not in FORMATS:
        raise InputError(f"-o: expected a file ending in .png, .svg or .html, got {str(output)[:80]!r}")
    s = plotdata.series(read_jsonl(t, job_id, "events.jsonl"), read_jsonl(t, job_id, "samples.jsonl"),
                        dict(st, job_id=job_id))
    s["target"] = t.label
    if output is not None:
        write_file(s, output)
    if as_json:
        out.print_json(json.dumps(dict(s, file=str(output) if output else None)))
    elif output is not None:
        out.print(render.lit(f"wrote {output} ({len(s['points']) + len(s['minutes'])} points, "
                             f"{len(s['rollbacks'])} rollbacks)"))
    else:
        for line in terminal(s, width=max(20, min(out.width, 200) - 8)):
            out.print(line, soft_wrap=True)
