"""``gpujob exec``, ``disconnect``, ``doctor``, ``hosts``: commands about targets."""

from __future__ import annotations

import collections
import json
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, List, Optional

import typer

from gpujob.agent.base import wire
from gpujob.agent.base.protocol import ENDED
from gpujob.show import render
from gpujob.ops import bodies
from gpujob.errors import GpujobError, InputError
from gpujob.transport.base import RawStdin
from gpujob.cli.app import app, ctx, err, out


@app.command("exec")
def exec_(target: str = typer.Argument(..., help="container name or host/name"),
          argv: List[str] = typer.Argument(None, help="the command, after --"),
          timeout: Optional[float] = typer.Option(None, help="end the command after this many seconds"),
          no_stdin: bool = typer.Option(False, "--no-stdin", "-n", help="do not read stdin (like ssh -n): "
                                        "the command gets an empty one"),
          as_json: bool = typer.Option(False, "--json",
                                       help="JSON Lines: {stream, data} per chunk of output, "
                                       "then {exit_code, timed_out}")):
    """Run one command in the container; output streamed, exit code passed through."""
    if not argv:
        raise InputError("exec: no command given; usage: gpujob exec TARGET -- COMMAND [ARGS...]")
    t = ctx.target(target)
    stdin = None if no_stdin or sys.stdin is None or sys.stdin.isatty() else RawStdin(0)
    if not as_json:  # the same body the kept connection's daemon runs
        raise typer.Exit(bodies.run_exec(t, argv, stdin, timeout, sys.stdout.buffer, sys.stderr.buffer, err))
    from gpujob.show import jsonl
    on_out, on_err = jsonl.Chunks("stdout"), jsonl.Chunks("stderr")
    r = t.run(argv, stdin=stdin, timeout=timeout, on_stdout=on_out, on_stderr=on_err)
    on_out.close()
    on_err.close()
    jsonl.emit({"exit_code": r.exit_code, "timed_out": bool(r.timed_out)})
    bodies.say_timed_out(r, timeout, t, err)
    raise typer.Exit(r.exit_code)


@app.command()
def disconnect(every: bool = typer.Option(False, "--all", help="every kept connection of this user's "
                                                                "(other installs, terminals, state dirs)")):
    """End this environment's kept connection: the background process holding SSH connections (README)."""
    from gpujob.conn.client import disconnect_line
    print(disconnect_line(every))


# ---- doctor / hosts --------------------------------------------------------

@app.command()
def doctor(target: Optional[str] = typer.Argument(None, help="container (default: every target)"),
           spec: Optional[Path] = typer.Option(None, "--spec", help="also check the driver against "
                                               "the CUDA of this job's profiles"),
           as_json: bool = typer.Option(False, "--json"),
           sets: Optional[List[str]] = typer.Option(None, "--set", metavar="KEY=VALUE", help="with --spec: "
                                                    "replace one spec value, as submit's --set")):
    """Check a target: host key, pct, container, python3, uv, disk, GPUs and driver."""
    from gpujob.ops import doctor as doc
    cudas: list[str] = []
    workdir = None
    named: str | list[str] | None = target  # a spec's target may be a list (multi-node)
    if spec is not None:
        from gpujob.spec.model import load_spec
        s = load_spec(spec, sets or [])
        cudas = sorted({p.cuda for p in s.profiles if p.cuda})
        workdir = s.workdir
        named = target or s.target
    elif sets:
        raise InputError("--set: only with --spec (it changes that spec's values)")
    names = (named if isinstance(named, list) else [named]) if named else \
        [f"{h}/{c}" for h, c in ctx.targets().inventory.targets()]  # a list: every node of a multi-node spec
    report = {}
    failed = False
    for name in names:
        try:
            t = ctx.target(name)
            label = t.label
            checks = doc.judge(doc.gather(t, workdir), expected_gpus=t.expected_gpus, cudas=cudas)
            if spec is not None:  # the trainer's version, and the command's program, in each built venv
                from gpujob.ops import doctor_recipe
                if s.recipe:
                    checks += doc.with_fixes(doctor_recipe.judge(s.recipe, doctor_recipe.gather(t, s)))
                prog = doctor_recipe.program(s.train.command)
                checks += doctor_recipe.program_checks(doctor_recipe.gather_program(t, s, prog), prog)
        except GpujobError as e:  # one target out of reach is a failed check, not the end of doctor
            if isinstance(e, InputError):
                raise
            label, checks = name, doc.with_fixes([doc.Check("connect", doc.CheckStatus.FAIL, e.message,
                                                            e.hint or "")])
        report[label] = [c.as_dict() for c in checks]
        failed |= any(c.status == doc.CheckStatus.FAIL for c in checks)
        if not as_json:
            out.print(render.doctor_table(label, checks))
    if as_json:
        out.print_json(json.dumps(report))
    else:
        out.print(render.doctor_summary(collections.Counter(c["status"] for cs in report.values()
                                                            for c in cs)))
    raise typer.Exit(1 if failed else 0)


@app.command()
def hosts(as_json: bool = typer.Option(False, "--json"),
          check: bool = typer.Option(False, "--check", help="only validate the inventory file; "
                                     "connect to nothing (exit 0 when valid, 2 with the first problem)")):
    """The inventory with each container's status (hosts queried in parallel)."""
    from gpujob import kinds
    from gpujob.inventory.hosts import find_inventory, load_inventory
    if check:
        path = find_inventory(ctx.hosts)
        inv = load_inventory(path)
        if as_json:
            out.print_json(json.dumps({"path": str(path) if path else None, "valid": True,
                                       "hosts": len(inv.hosts), "containers": len(inv.targets())}))
            return
        out.print(render.lit(f"{path or 'built-in inventory'}: ok ({len(inv.hosts)} hosts, "
                             f"{len(inv.targets())} containers)"))
        return
    targets = ctx.targets()
    inv = targets.inventory

    def one(host_name: str) -> list[dict]:
        rows = []
        for cname in inv.hosts[host_name].containers:
            row: dict[str, Any] = {"host": host_name, "container": cname, "kind": inv.hosts[host_name].kind}
            try:
                t = targets.open(f"{host_name}/{cname}")
                row["vmid"] = t.vmid
                row["status"] = t.driver.status(t)
                if row["status"] in kinds.READY:
                    jobs = t.ask(wire.StatusAnswer, "status").jobs
                    live = [j for j in jobs if j.get("state") not in ENDED]
                    row["job"] = live[-1]["job_id"] if live else None
            except GpujobError as e:
                row["status"] = "unreachable"
                row["error"] = e.message
            rows.append(row)
        return rows

    with ThreadPoolExecutor(max_workers=max(1, len(inv.hosts))) as pool:
        rows = [r for part in pool.map(one, list(inv.hosts)) for r in part]
    if as_json:
        out.print_json(json.dumps({"source": inv.source, "targets": rows}))
        return
    out.print(render.hosts_table(rows, inv.source))
