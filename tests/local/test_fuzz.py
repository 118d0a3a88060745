"""Seeded fuzzing of the spec and inventory loaders (issue 10).

2,400 mutants of jobs/demo.yaml, jobs/dflash.yaml and a hosts.yaml (types, deletions,
unknown keys, huge values, unicode, nesting, aliases, binary garbage, empty files,
duplicate keys, tabs, newlines in names, tags, encodings, truncation) go through the
loaders, each in a forked child of this preloaded process under 2 CPU-s and
+200 MB of address space; 240 more go through the real CLI (`submit --plan`,
`hosts --check`). Every case must end in exit 0 or one error line `FILE:LINE: ...`
(2 for the CLI): no traceback, no hang, no second line but an optional hint.
"""

from __future__ import annotations

import collections
import json
import os
import re
import subprocess
from concurrent.futures import ThreadPoolExecutor

import yaml

from fuzzgen import mutants
from gpujob.inventory.hosts import load_inventory
from gpujob.spec.model import load_spec
from helpers import REPO, gpujob_argv
from limits import run_limited

SEED = 20261130
LOADER_CASES = 2400
CLI_CASES = 240


def classify(kind: str, message: str, path: str) -> str:
    """ok, error (one line with :LINE:), or what went wrong."""
    if kind != "error":
        return kind
    lines = [ln for ln in message.split("\n") if not ln.startswith("  hint: ")]
    if len(lines) != 1 or len(message.split("\n")) > 2:
        return "multi-line"
    if not re.match(re.escape(path) + r":\d+: ", lines[0]):
        return "no-line"
    return "error"


def _load(base: str, path: str) -> None:
    (load_inventory if base == "hosts" else load_spec)(path)


def test_loader_fuzz(tmp_path):
    counts: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    bad = []
    worst_rss = worst_cpu = 0.0
    for n, (base, kind, body) in enumerate(mutants(SEED, LOADER_CASES)):
        path = str(tmp_path / f"m{n}.yaml")
        with open(path, "wb") as f:
            f.write(body)
        out = run_limited(_load, base, path, cpu_s=2, extra_mb=200)
        verdict = classify(out.kind, out.message, path)
        if out.kind == "ok" or verdict == "error":
            assert out.rss_mb < 200
        worst_rss, worst_cpu = max(worst_rss, out.rss_mb), max(worst_cpu, out.cpu_s)
        counts[kind][verdict] += 1
        if verdict not in ("ok", "error"):
            bad.append((n, base, kind, verdict, out.message[-400:]))
        os.unlink(path)
    totals = sum(counts.values(), collections.Counter())
    print(f"\nloader fuzz: {LOADER_CASES} mutants: {dict(totals)}; worst child +{worst_rss:.0f} MB, "
          f"{worst_cpu:.2f} CPU-s\n  by class: "
          + json.dumps({k: dict(v) for k, v in sorted(counts.items())}))
    assert not bad, "\n".join(map(repr, bad[:5]))
    assert sum(totals.values()) == LOADER_CASES >= 2000
    assert totals["ok"] > 50 and totals["error"] > 1000  # the mutants reach both sides
    assert set(counts) >= {"types", "delete", "unknown", "huge", "unicode", "nesting", "alias", "garbage",
                           "empty", "duplicate", "tabs", "newline_name"}


def _cli(args: list[str], env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([*gpujob_argv(), *args], env=env, capture_output=True,
                          timeout=60, cwd=str(REPO))


def test_cli_fuzz(tmp_path):
    hosts = tmp_path / "hosts.yaml"
    hosts.write_text(yaml.safe_dump({"hosts": {"lab": {"kind": "local", "containers": {
        "demo": {"root": str(tmp_path / "demo")}, "ct200": {"root": str(tmp_path / "ct200")}}}}}))
    env = dict(os.environ, GPUJOB_HOSTS=str(hosts), XDG_STATE_HOME=str(tmp_path / "state"), COLUMNS="200")
    cases = mutants(SEED + 1, CLI_CASES)
    jobs_dir = tmp_path / "jobs"  # beside copies of the shipped trees, so relative paths mean the same
    jobs_dir.mkdir()
    (jobs_dir / "dflash").symlink_to(REPO / "jobs" / "dflash")
    (jobs_dir / "demo").symlink_to(REPO / "jobs" / "demo")

    def one(item):
        n, (base, kind, body) = item
        path = str(jobs_dir / f"m{n}.yaml")
        with open(path, "wb") as f:
            f.write(body)
        args = ["--hosts", path, "hosts", "--check"] if base == "hosts" else ["submit", path, "--plan"]
        try:
            p = _cli(args, env)
        except subprocess.TimeoutExpired:
            return kind, "hang", None
        err = p.stderr.decode("utf-8", "replace")
        if "Traceback" in err or p.returncode not in (0, 2):
            return kind, "traceback", (p.returncode, err[-800:])
        if p.returncode == 0:
            return kind, "ok", None
        verdict = classify("error", err.rstrip("\n").removeprefix("gpujob: "), path)
        return kind, verdict, (err[-800:] if verdict != "error" else None)

    with ThreadPoolExecutor(max_workers=3) as pool:
        results = list(pool.map(one, enumerate(cases)))
    totals = collections.Counter(v for _, v, _ in results)
    print(f"\nCLI fuzz: {CLI_CASES} mutants: {dict(totals)}")
    bad = [r for r in results if r[1] not in ("ok", "error")]
    assert not bad, "\n".join(map(repr, bad[:10]))
    assert len(results) >= 200 and totals["ok"] > 5 and totals["error"] > 100
    assert not (tmp_path / "demo").exists() and not (tmp_path / "ct200").exists()  # --plan changed nothing
