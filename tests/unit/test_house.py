"""The house rules, written here once so they cannot drift.

The agent: gpujob/agent/ is six wings. ``base`` is the ground floor; ``judge`` (pure
decisions) and ``home`` (the on-disk home) stand on it and never import each other;
``fleet``, ``supervisor`` and ``verbs`` stand above them in that order; ``main.py`` is the
top. The laptop side (gpujob/ outside agent/) imports only ``base`` and ``judge``.

The controller: gpujob/ outside agent/ is wings too (``CONTROLLER_MAY_IMPORT``, below): the
two faces ``cli`` and ``daemon`` never import each other, ``show`` never imports ``ops``, at
most 12 modules stand directly under gpujob/, and the thin tier (``entry``, ``complete``,
``conn/``) loads only the standard library. Imports are read with ast, lazy ones inside
functions included."""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

PKG = Path(__file__).resolve().parents[2] / "gpujob"
AGENT = PKG / "agent"

#: each wing, and the wings it may import (its own always)
MAY_IMPORT = {
    "base": set(),
    "judge": {"base"},
    "home": {"base"},
    "fleet": {"base", "judge", "home"},
    "supervisor": {"base", "judge", "home", "fleet"},
    "verbs": {"base", "judge", "home", "fleet", "supervisor"},
    "main": {"base", "judge", "home", "fleet", "supervisor", "verbs"},
}
LAPTOP_MAY_IMPORT = {"base", "judge"}

#: the laptop side's references to the rest of the agent that must stay, each with its reason
#: (file under gpujob/, the agent module it names): none is an import the laptop runs
LAPTOP_KEEPS = {
    ("ops/target.py", "gpujob.agent.main"):
        "the agent zip's __main__.py, a string: the container runs agent.main, the laptop never imports it",
    ("transport/mux_server.py", "gpujob.agent.main"):
        "the zygote preloads the agent in the container (mux_server ships as python3 -c); not run on the "
        "laptop",
}

_NAMED = re.compile(r"\bgpujob\.agent\.(\w+)(?:\.(\w+))?")


def wing_of(module: str) -> str | None:
    """The wing of a dotted module under gpujob.agent (``main`` for agent.main), else None."""
    parts = module.split(".")
    if parts[:2] != ["gpujob", "agent"] or len(parts) < 3:
        return None
    return parts[2]


def imported(tree: ast.AST) -> list:
    """(line, dotted module) of every import in ``tree``; ``from gpujob.agent[.W] import x``
    names the module ``x`` when ``x`` is one."""
    out = []
    for n in ast.walk(tree):
        if isinstance(n, ast.Import):
            out += [(n.lineno, a.name) for a in n.names]
        elif isinstance(n, ast.ImportFrom):
            if n.level:
                out.append((n.lineno, "." * n.level + (n.module or "")))
            elif n.module in ("gpujob", "gpujob.agent") or n.module in {f"gpujob.agent.{w}"
                                                                        for w in MAY_IMPORT}:
                out += [(n.lineno, f"{n.module}.{a.name}") for a in n.names]
            elif n.module:
                out.append((n.lineno, n.module))
    return out


def agent_modules() -> dict:
    """{dotted module: path} of every module under gpujob/agent/."""
    return {".".join(p.relative_to(PKG.parent).with_suffix("").parts).removesuffix(".__init__"): p
            for p in sorted(AGENT.rglob("*.py"))}


def wing_breaks(path: Path, source: str) -> list:
    """One line per import of an agent module ``source`` that the house rule forbids."""
    here = wing_of(".".join(path.relative_to(PKG.parent).with_suffix("").parts))
    bad = []
    for line, mod in imported(ast.parse(source)):
        if mod.startswith("."):
            bad.append(f"{path.name}:{line}: relative import {mod} (write gpujob.agent.WING.MODULE)")
            continue
        there = wing_of(mod)
        if there is None or there == here:
            continue
        if there not in MAY_IMPORT[here]:
            bad.append(f"{path.relative_to(AGENT)}:{line}: {here} imports {mod} ({there}); "
                       f"{here} may import {sorted(MAY_IMPORT[here]) or 'no other wing'}")
    return bad


def test_every_agent_module_lives_in_a_wing():
    strays = [str(p.relative_to(AGENT)) for p in AGENT.glob("*.py")
              if p.name not in ("__init__.py", "main.py")]
    assert strays == [], f"modules outside the wings: {strays}"
    wings = sorted(p.name for p in AGENT.iterdir() if p.is_dir() and p.name != "__pycache__")
    assert wings == sorted(set(MAY_IMPORT) - {"main"})
    for w in wings:
        init = AGENT / w / "__init__.py"
        tree = ast.parse(init.read_text())
        doc = ast.get_docstring(tree)
        assert doc and "\n\n" not in doc.strip(), f"{w}/__init__.py: one paragraph that says what the wing is"
        assert len(tree.body) == 1, f"{w}/__init__.py holds its docstring only (import the modules by name)"


def test_each_wing_imports_only_the_wings_below_it():
    bad = []
    for path in agent_modules().values():
        bad += wing_breaks(path, path.read_text())
    assert bad == [], "\n".join(bad)


def test_judge_and_home_never_import_each_other():
    # the table says so; this keeps it from being loosened by an edit of one row
    assert "home" not in MAY_IMPORT["judge"] and "judge" not in MAY_IMPORT["home"]
    # transitively closed
    assert all(w in MAY_IMPORT[above] for above in MAY_IMPORT for w in MAY_IMPORT[above])


def test_the_rule_catches_an_import_upward():
    # a check that reads nothing would pass the test above: this one must break it
    path = AGENT / "judge" / "policy.py"
    assert wing_breaks(path, "def f():\n    from gpujob.agent.home import journal\n")
    assert wing_breaks(AGENT / "base" / "fsio.py", "from gpujob.agent.supervisor.watch import POLL\n")
    assert wing_breaks(AGENT / "home" / "lock.py", "from gpujob.agent import judge\n")
    assert wing_breaks(path, "from . import pauses\n")
    assert not wing_breaks(path, "from gpujob.agent.base.protocol import JobState\nimport os\n")


def test_no_circle_of_imports_inside_the_agent():
    mods = agent_modules()
    packages = {"gpujob.agent", *(f"gpujob.agent.{w}" for w in MAY_IMPORT)}
    graph = {}
    for mod, path in mods.items():
        deps = set()
        for _, name in imported(ast.parse(path.read_text())):
            while name and name not in mods:
                name = name.rpartition(".")[0]
            if name and name != mod and name not in packages:
                deps.add(name)
        graph[mod] = deps
    seen, on_path, circles = set(), [], []

    def visit(m):
        if m in on_path:
            circles.append(on_path[on_path.index(m):] + [m])
            return
        if m in seen:
            return
        seen.add(m)
        on_path.append(m)
        for d in sorted(graph[m]):
            visit(d)
        on_path.pop()

    for m in sorted(graph):
        visit(m)
    assert circles == [], "\n".join(" -> ".join(c) for c in circles)


def test_the_laptop_side_imports_only_base_and_judge():
    bad = []
    for path in sorted(p for p in PKG.rglob("*.py") if AGENT not in p.parents):
        rel = path.relative_to(PKG).as_posix()
        source = path.read_text()
        bad += [f"{rel}:{line}: imports {mod}" for line, mod in imported(ast.parse(source))
                if wing_of(mod) not in (None, *LAPTOP_MAY_IMPORT) and (rel, mod) not in LAPTOP_KEEPS]
        # a module named in a string (python -c code, __import__) is an import too, run elsewhere
        named = {m.group(0) for m in _NAMED.finditer(source)
                 if m.group(1) not in LAPTOP_MAY_IMPORT and m.group(1) in MAY_IMPORT}
        bad += [f"{rel}: names {mod} in a string" for mod in sorted(named) if (rel, mod) not in LAPTOP_KEEPS]
    assert bad == [], "\n".join(bad) + "\n(move the pure part into agent/base/ or agent/judge/, or list it " \
                                        "in LAPTOP_KEEPS with its reason)"


def test_the_laptop_keeps_are_still_there():
    # a reason for an import that went away is a stale exception: it would let the next one in
    for (rel, mod), _why in LAPTOP_KEEPS.items():
        assert mod in (PKG / rel).read_text(), f"{rel} no longer names {mod}: drop it from LAPTOP_KEEPS"


# judge/ is pure: it decides over values and never touches the disk (its callers read the files)
IO_MODULES = {"os", "io", "gzip", "zlib", "bz2", "lzma", "glob", "shutil", "pathlib", "tempfile",
              "subprocess", "socket", "sqlite3", "fcntl", "mmap"}
IO_NAMES = {"open", "read_text", "read_bytes", "write_text", "write_bytes", "read_records", "job_records",
            "read_json", "write_json", "append_record", "listdir", "scandir", "stat", "unlink", "remove",
            "makedirs", "fsync_dir", "iterdir", "rglob", "glob", "exists", "getmtime", "getsize"}


def judge_io(source: str) -> list:
    """One line per file access (a call, or a module or name imported for one) in ``source``."""
    bad = []
    for n in ast.walk(ast.parse(source)):
        if isinstance(n, ast.Call):
            f = n.func
            name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None
            if name in IO_NAMES:
                bad.append(f"{n.lineno}: calls {name}()")
        elif isinstance(n, ast.Import):
            bad += [f"{n.lineno}: imports {a.name}" for a in n.names if a.name.split(".")[0] in IO_MODULES]
        elif isinstance(n, ast.ImportFrom) and n.module:
            if n.module.split(".")[0] in IO_MODULES:
                bad.append(f"{n.lineno}: imports from {n.module}")
            bad += [f"{n.lineno}: imports {n.module}.{a.name}" for a in n.names if a.name in IO_NAMES]
    return bad


def test_judge_reads_and_writes_no_file():
    bad = [f"judge/{p.name}:{line}" for p in sorted((AGENT / "judge").glob("*.py"))
           for line in judge_io(p.read_text())]
    assert bad == [], "judge/ is pure: read the file at the edge and pass the records in\n" + "\n".join(bad)


def test_the_purity_check_catches_a_file_read():
    assert judge_io("def f(p):\n    with open(p) as f:\n        return f.read()\n")
    assert judge_io("from pathlib import Path\n")
    assert judge_io("def f(p):\n    return p.read_text()\n")
    assert judge_io("from gpujob.agent.base.trace import read_records\n")
    assert judge_io("import os.path\n")
    assert not judge_io("import re\nfrom gpujob.agent.base.fsio import now, json_objects\n")


# ---- the controller (gpujob/ outside agent/) ---------------------------------------------------
#
# Its wings, from the top floor down: ``entry`` (the console script's first stop) stands on the two
# faces, ``cli`` (typer commands) and ``daemon`` (the kept connection's server), which never import
# each other; both stand on ``ops`` (what gpujob does, values in and out), which stands on
# ``inventory`` (hosts), ``spec`` (what the user writes), ``show`` (what people read), ``kinds``,
# ``conn`` and ``transport``; ``ground`` (errors, steps, yamlsrc, lazyimport) and the agent's
# base/ and judge/ are below everything. ``complete`` (a Tab) stands on nothing of ours.

#: each top-level module of gpujob/ outside a package, and its wing (a new one is placed here)
GROUND_FILES = {"__init__.py": "ground", "errors.py": "ground", "steps.py": "ground", "yamlsrc.py": "ground",
                "lazyimport.py": "ground", "entry.py": "entry", "complete.py": "complete",
                "complete_table.py": "complete"}
#: the packages of gpujob/ that are wings of the controller (agent/ has its own table above;
#: demo/ is a job the demo runs, not the controller)
PACKAGES = {"cli", "daemon", "ops", "show", "inventory", "spec", "kinds", "conn", "transport"}
OUTSIDE = {"agent", "demo"}

_BELOW_OPS = {"ground", "agent", "transport", "conn", "kinds", "spec", "show", "inventory"}
#: each controller wing, and the wings it may import (its own always); "agent" is base/ and judge/
CONTROLLER_MAY_IMPORT = {
    "ground": set(),
    "complete": set(),
    "transport": {"ground"},
    "conn": {"ground", "transport"},
    "kinds": {"ground", "agent", "transport"},
    "spec": {"ground", "agent"},
    "show": {"ground", "agent"},
    "inventory": {"ground", "agent", "transport", "conn", "kinds", "spec"},
    "ops": _BELOW_OPS,
    "cli": _BELOW_OPS | {"ops"},
    "daemon": _BELOW_OPS | {"ops"},
    "entry": _BELOW_OPS | {"ops", "cli", "daemon", "complete"},
}
#: at most this many modules directly under gpujob/ (the rest lives in wings)
TOP_LEVEL_MAX = 12

#: the thin tier: what a Tab, ``--version`` and the kept connection's fast commands load. At load
#: (the module's own body, not a function's) each imports only the standard library and the others.
THIN = {"__init__.py", "entry.py", "complete.py", "complete_table.py", "conn/__init__.py", "conn/client.py",
        "conn/paths.py", "conn/proto.py"}
#: modules of a thin wing that are not thin, each with its reason
THIN_EXCEPTIONS = {
    "conn/remote.py": "KeptTransport, the full CLI's side of relay: it is a transport (imports transport/) "
                      "and only the full CLI loads it",
}


def controller_wing(rel: str) -> str | None:
    """The wing of a path under gpujob/ (``ops/jobs.py``), "agent"/"demo" outside, else None."""
    top = rel.split("/")[0]
    if "/" in rel:
        return top if top in PACKAGES | OUTSIDE else None
    return GROUND_FILES.get(rel)


def module_wing(module: str) -> str | None:
    """The wing of a dotted module of gpujob (``gpujob.ops.jobs``, ``gpujob.errors``), else None."""
    parts = module.split(".")
    if parts[0] != "gpujob":
        return None
    if len(parts) == 1:
        return "ground"  # gpujob itself: __init__.py
    if parts[1] in PACKAGES | OUTSIDE:
        return parts[1]
    return GROUND_FILES.get(parts[1] + ".py")


def controller_breaks(rel: str, source: str) -> list:
    """One line per import in ``source`` (the module at ``rel`` under gpujob/) that the
    controller's table forbids; lazy imports inside functions count as well."""
    here = controller_wing(rel)
    bad = []
    for line, mod in imported(ast.parse(source)):
        if mod.startswith("."):
            bad.append(f"{rel}:{line}: relative import {mod} (write gpujob.WING.MODULE)")
            continue
        if mod == "gpujob.__version__":  # from gpujob import __version__: the package's own face
            continue
        there = module_wing(mod)
        if there is None or there == here or there == "agent":  # the agent: LAPTOP_MAY_IMPORT's rule
            continue
        if there not in CONTROLLER_MAY_IMPORT[here]:
            bad.append(f"{rel}:{line}: {here} imports {mod} ({there}); {here} may import "
                       f"{sorted(CONTROLLER_MAY_IMPORT[here]) or 'no other wing'}")
    return bad


def _load_time_imports(tree: ast.Module) -> list:
    """(line, module) of the imports a module runs when it is loaded: its body's, and those
    under a top-level if/try (``if TYPE_CHECKING:`` is never run)."""
    out = []

    def walk(stmts):
        for n in stmts:
            if isinstance(n, ast.If) and ast.unparse(n.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING"):
                walk(n.orelse)
            elif isinstance(n, (ast.If, ast.Try)):
                walk(n.body + n.orelse + getattr(n, "finalbody", []))
                for h in getattr(n, "handlers", []):
                    walk(h.body)
            elif isinstance(n, (ast.Import, ast.ImportFrom)):
                out.extend(imported(ast.Module(body=[n], type_ignores=[])))
    walk(tree.body)
    return out


def thin_breaks(rel: str, source: str) -> list:
    """One line per import a thin module runs at load that is neither the standard library
    nor another thin module."""
    bad = []
    for line, mod in _load_time_imports(ast.parse(source)):
        top = mod.split(".")[0]
        if top == "__future__" or (top in sys.stdlib_module_names and top != "gpujob"):
            continue
        path = "/".join(mod.split(".")[1:])
        if mod == "gpujob.__version__" or f"{path}.py" in THIN or f"{path}/__init__.py" in THIN:
            continue
        bad.append(f"{rel}:{line}: imports {mod} at load (the thin tier: the standard library and "
                   f"{sorted(THIN)} only; import it inside the function that needs it)")
    return bad


def controller_modules() -> dict:
    """{path under gpujob/: path} of every module of the controller."""
    return {p.relative_to(PKG).as_posix(): p for p in sorted(PKG.rglob("*.py"))
            if p.relative_to(PKG).parts[0] not in OUTSIDE}


def test_every_controller_module_lives_in_a_wing():
    strays = [rel for rel in controller_modules() if controller_wing(rel) is None]
    assert strays == [], f"modules outside the wings (place each in GROUND_FILES or a package): {strays}"
    top = sorted(p.name for p in PKG.glob("*.py"))
    assert len(top) <= TOP_LEVEL_MAX, \
        f"{len(top)} modules directly under gpujob/ (at most {TOP_LEVEL_MAX}): {top}"
    assert set(GROUND_FILES) == set(top), "GROUND_FILES names a module that is not there"
    for w in PACKAGES - {"conn", "kinds", "transport", "cli", "daemon"}:  # the new wings say what they are
        doc = ast.get_docstring(ast.parse((PKG / w / "__init__.py").read_text()))
        assert doc and "\n\n" not in doc.strip(), f"{w}/__init__.py: one paragraph that says what the wing is"


def test_each_controller_wing_imports_only_the_wings_below_it():
    bad = []
    for rel, path in controller_modules().items():
        bad += controller_breaks(rel, path.read_text())
    assert bad == [], "\n".join(bad)


def test_the_two_faces_never_import_each_other():
    assert "cli" not in CONTROLLER_MAY_IMPORT["daemon"] and "daemon" not in CONTROLLER_MAY_IMPORT["cli"]
    assert "ops" not in CONTROLLER_MAY_IMPORT["show"]  # show/ draws values: what to fetch is ops/'s
    table = CONTROLLER_MAY_IMPORT
    assert all(w in table[above] for above in table for below in table[above] if below != "agent"
               for w in table[below]), "the table is transitively closed"


def test_the_thin_tier_loads_only_the_standard_library():
    bad = []
    for rel, path in controller_modules().items():
        if rel in THIN:
            bad += thin_breaks(rel, path.read_text())
    assert bad == [], "\n".join(bad)
    assert all(controller_wing(rel) is not None for rel in THIN | set(THIN_EXCEPTIONS))
    conn = {rel for rel in controller_modules() if rel.startswith("conn/")}
    assert conn <= THIN | set(THIN_EXCEPTIONS), f"conn/ modules neither thin nor listed: {conn - THIN}"


def test_the_controller_rule_catches_a_forbidden_arrow():
    # a check that reads nothing would pass the tests above: these must break it
    assert controller_breaks("daemon/server.py", "from gpujob.cli import app\n")
    assert controller_breaks("cli/app.py", "def f():\n    from gpujob.daemon import pool\n")
    assert controller_breaks("show/plot.py", "from gpujob.ops import jobs\n")
    assert controller_breaks("spec/model.py", "from gpujob.inventory.hosts import Host\n")
    assert controller_breaks("errors.py", "import gpujob.spec.model\n")
    assert controller_breaks("ops/jobs.py", "from . import target\n")
    assert not controller_breaks("ops/jobs.py", "from gpujob.spec.model import JobSpec\nimport os\n")
    assert thin_breaks("entry.py", "import typer\n")
    assert thin_breaks("conn/client.py", "from gpujob.ops import target\n")
    assert thin_breaks("complete.py", "try:\n    import yaml\nexcept ImportError:\n    pass\n")
    assert not thin_breaks("entry.py", "import os\nfrom gpujob.conn import paths\n"
                                       "def f():\n    from gpujob.cli import main\n")
    assert not thin_breaks("conn/client.py", "from typing import TYPE_CHECKING\n"
                                             "if TYPE_CHECKING:\n    from gpujob.ops.target import Target\n")


def test_no_circle_of_imports_in_the_controller():
    mods = {".".join(("gpujob", *Path(rel).with_suffix("").parts)).removesuffix(".__init__"): p
            for rel, p in controller_modules().items()}
    graph = {}
    for mod, path in mods.items():
        deps = set()
        for _, name in imported(ast.parse(path.read_text())):
            while name and name not in mods:
                name = name.rpartition(".")[0]
            if name and name != mod and not (mods[name].name == "__init__.py"):
                deps.add(name)
        graph[mod] = deps
    circles: list = []
    seen: set = set()

    def visit(m, on_path):
        if m in on_path:
            circles.append(on_path[on_path.index(m):] + [m])
            return
        if m in seen:
            return
        seen.add(m)
        for d in sorted(graph[m]):
            visit(d, on_path + [m])
    for m in sorted(graph):
        visit(m, [])
    assert circles == [], "\n".join(" -> ".join(c) for c in circles)


def test_only_cli_imports_typer():
    # ops/ is values in and out: what a face does with them (typer's options, exit codes) is the face's
    bad = [f"{rel}:{line}: imports {mod}" for rel, p in controller_modules().items()
           if controller_wing(rel) != "cli"
           for line, mod in imported(ast.parse(p.read_text())) if mod.split(".")[0] in ("typer", "click")]
    assert bad == [], "\n".join(bad)
