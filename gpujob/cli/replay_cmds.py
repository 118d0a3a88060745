"""``gpujob replay SOURCE`` (the pure policy over a recorded run: agent/judge/replay.py) and
the trace fetch behind it and ``gpujob logs JOB --trace -o FILE``."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Optional

import typer

from gpujob.show import render
from gpujob.cli.app import app, err, job_target, out
from gpujob.errors import InputError


#: the most a fetched file of the job's dir may hold: a trace part rotates at 64 MiB (compressed)
MAX_FETCH = 256 << 20


def fetch_file(job_id: str, t, name: str, limit: int = MAX_FETCH) -> bytes:
    """A file of the job's dir, fetched as logs are (the agent's tail, no follow); a host that
    sends more than ``limit`` bytes is misbehaving (never held past it)."""
    from gpujob.errors import HostMisbehaving
    from gpujob.ops.follow import follow_log
    buf = bytearray()

    def write(chunk: bytes) -> None:
        if len(buf) + len(chunk) > limit:
            raise HostMisbehaving(f"{t.label}: job {job_id}'s {name} is over {limit >> 20} MiB; not read "
                                  f"further")
        buf.extend(chunk)
    follow_log(t, job_id, file=name, follow=False, write=write,
               notice=lambda m: err.print(render.lit(f"gpujob: {m}", "yellow")))
    return bytes(buf)


def fetch_trace(job_id: str, t, limit: int = MAX_FETCH) -> bytes:
    """The job's trace: the rotated older part (if any) then the current one, each at most
    ``limit`` bytes (a part rotates past the job's journal.keep_log: ``trace_limit``)."""
    from gpujob.agent.base import trace
    from gpujob.errors import GpujobError, HostMisbehaving
    data = b""
    for name in (trace.OLD, trace.NAME):
        try:
            data += fetch_file(job_id, t, name, limit)
        except HostMisbehaving:
            raise
        except GpujobError:
            if name == trace.NAME and not data:
                raise
    return data


def trace_limit(job: object) -> int:
    """The most one part of a job's trace may hold: it rotates once past the job's
    journal.keep_log (checked once a second), so that and a quarter more."""
    journal = ((job.get("spec") or {}).get("journal") or {}) if isinstance(job, dict) else {}
    keep = journal.get("keep_log") if isinstance(journal, dict) else None
    if isinstance(keep, int) and not isinstance(keep, bool) and keep > 0:
        return max(MAX_FETCH, keep + keep // 4 + (16 << 20))
    return MAX_FETCH


def _spec_dict(spec: Optional[Path]) -> Optional[dict]:
    if spec is None:
        return None
    from gpujob.spec.model import load_spec
    return load_spec(spec).to_agent_dict()


def _baseline(text: Optional[str]) -> Optional[float]:
    """--baseline in the spec's own forms (12800, 12.8K, 1.2M)."""
    if text is None:
        return None
    from gpujob.spec.types import _rate
    try:
        value = _rate(text)
    except ValueError as e:
        raise InputError(f"--baseline: {e}") from None
    if value <= 0:
        raise InputError(f"--baseline: expected a rate > 0, got {text[:40]!r}")
    return value


def _trace_spec(head: dict, source: str) -> dict:
    """The throughput section a trace's header recorded (its first line's meta), checked
    as a spec's throughput section is (its types: the judge takes its numbers as numbers)."""
    tp = (head.get("meta") or {}).get("throughput") if "trace" in head else None
    if not isinstance(tp, dict):
        raise InputError(f"{source}: its first line records no throughput section; give --spec SPEC")
    from pydantic import ValidationError
    from gpujob.spec.throughput import Throughput
    try:  # the keys this version knows (an older or newer writer may have recorded others)
        Throughput.model_validate({k: v for k, v in tp.items() if k in Throughput.model_fields})
        why = None
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ()))
        why = f"field meta.throughput.{where}: {first.get('msg', 'not valid')[:120]}"
    if why:
        raise InputError(f"{source}:1: {why}")
    return {"throughput": tp}


def _replay_file(path: Path, source: str, spec_d, profile, baseline) -> tuple:
    from gpujob.agent.base import jsonl, trace
    from gpujob.agent.judge import replay as rp
    with open(path, "rb") as f:
        gz = f.read(2) == b"\x1f\x8b"
        f.seek(0)
        if gz:
            size = os.fstat(f.fileno()).st_size
            recs = trace.iter_records(jsonl.file_chunks(f), source, jsonl.text_limit(size))
            head: dict = next(recs, {})
            if spec_d is None:  # the trace's first line: the throughput section it was judged with
                spec_d = _trace_spec(head, source)
            return rp.replay_records(_chain(head, recs), spec_d, profile, baseline)
        if spec_d is None:
            raise InputError("--spec: needed to replay a samples file (it carries no throughput section; a "
                             "trace file or a job id brings its own)")
        recs = (rec for _n, rec in jsonl.records(jsonl.file_chunks(f), source, check=_sample_check))
        return rp.replay_sample_records(recs, spec_d, profile, baseline)


def _chain(head: dict, rest):
    if head:
        yield head
    yield from rest


def _sample_check(rec: dict):
    from gpujob.agent.base import jsonl
    return jsonl.field_error(rec, {"t": "number", "value": "?number", "step": "?number",
                                   "profile": "?string"})


@app.command()
def replay(source: str = typer.Argument(..., metavar="SOURCE", help="a job id, a trace file (*.jsonl.gz) "
                                        "or a samples.jsonl ({t, value, [step], [profile]} a line)"),
           spec: Optional[Path] = typer.Option(None, "--spec", help="judge with this spec's throughput "
                                               "section (default: the job's own)"),
           profile: Optional[str] = typer.Option(None, "--profile", "-p", help="judge as this profile"),
           baseline_text: Optional[str] = typer.Option(None, "--baseline", metavar="RATE", help="a baseline "
                                                       "(tok/s: 12800, 12.8K, 1.2M as in a spec) to judge "
                                                       "min_ratio against (default: the one each run of the "
                                                       "job was judged against, recorded in its trace)"),
           target: Optional[str] = typer.Option(None, "--target", "-t"),
           as_json: bool = typer.Option(False, "--json", help="JSON Lines: each decision, then "
                                        "{\"summary\": {...}}")):
    """Run the rollback policy offline over a recorded run and print each decision it takes."""
    from gpujob.agent.base import jsonl, trace
    from gpujob.agent.judge import replay as rp
    baseline = _baseline(baseline_text)
    spec_d = _spec_dict(spec)
    path = Path(source)
    try:
        if path.is_file():  # read here, at the edge, in bounded pieces: judge/replay.py takes records
            decisions, summary = _replay_file(path, source, spec_d, profile, baseline)
        else:
            job_id, t = job_target(source, target)
            got = jsonl.loads(fetch_file(job_id, t, "job.json", limit=16 << 20))
            if spec_d is None:
                spec_d = got.get("spec") if isinstance(got, dict) else None
                if not isinstance(spec_d, dict):
                    raise InputError(f"job {job_id}: its job.json holds no spec; give --spec SPEC")
            data = fetch_trace(job_id, t, trace_limit(got))
            recs = trace.iter_records([data], f"job {job_id}'s {trace.NAME}", jsonl.text_limit(len(data)))
            decisions, summary = rp.replay_records(recs, spec_d, profile, baseline)
    except jsonl.BadFile as e:
        raise InputError(str(e)) from None
    except ValueError as e:  # job.json that does not parse or nests too deep
        raise InputError(f"{source}: {e}") from None
    for d in decisions:
        if as_json:
            out.print(render.lit(json.dumps(d, sort_keys=True)), soft_wrap=True)
        else:
            t_txt = f"+{d['t'] - summary['per_segment'][d['segment']]['start']:.1f}s" if d.get("t") else ""
            out.print(render.lit(f"[{d['segment']}] {t_txt:>9} {d['verdict']:<12} {d['reason']}"),
                      soft_wrap=True)
    if as_json:
        out.print(render.lit(json.dumps({"summary": summary}, sort_keys=True)), soft_wrap=True)
    else:
        out.print(render.lit(rp.summary_line(summary)))
