"""Issue 34 item 3: the docs are checked against the code, not remembered. A changed default,
recipe proof, `--help` text, jobs/dflash.yaml or its plan fails here until the docs follow."""

from __future__ import annotations

import re
from pathlib import Path

from gpujob.recipes import RECIPES
from gpujob.spec import Rollback

REPO = Path(__file__).resolve().parents[1]
SPEC_MD = (REPO / "docs" / "spec.md").read_text()


def table_default(section_marker: str, field: str) -> str:
    """The default column of ``field``'s row in the table after ``section_marker``."""
    after = SPEC_MD[SPEC_MD.index(section_marker):]
    m = re.search(rf"^\| `{re.escape(field)}` \| ([^|]+) \|", after, re.M)
    assert m, f"docs/spec.md: no row for {field} after {section_marker}"
    return m.group(1).strip()


def test_rollback_on_default_is_the_codes():
    assert table_default("## `rollback`", "on") == "`[" + ", ".join(Rollback().on) + "]`"


def test_spec_md_says_what_the_recipes_were_proven_on():
    """docs/spec.md called every recipe unproven after each was run on the H200."""
    proven = [r for r in RECIPES.values() if "H200" in r.proven_on]
    assert proven and "none is yet proven" not in SPEC_MD
    if len(proven) == len(RECIPES):
        assert "Each was then\nproven on one H200" in SPEC_MD
