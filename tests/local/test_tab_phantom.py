"""Tab completion and a submit killed before the container had the job (issue 34 row 2's
phantom): the row it left in this laptop's index is `submitting`, its gpujob dead, and it
never asked the container to start the job. Completion offered it until the next `ps`
forgot it; now it never offers it. A submit killed after it asked (the job may be real)
stays offered, and so does one still going on in another shell. The death is injected by
GPUJOB_TEST_DIE_AT into the installed entry point on the local kind."""

from __future__ import annotations

import sqlite3

from helpers import cli, local_env
from test_submit_death import index_jobs, killed_submit, spec, tab_jobs


def test_a_phantom_row_is_never_offered_by_tab_even_before_ps(tmp_path):
    env, job = killed_submit(tmp_path, "submit_reserved")
    assert index_jobs(tmp_path) == [job]  # the row is there: `ps` has not run yet
    assert tab_jobs(env) == []


def test_a_submit_killed_after_the_agent_started_the_job_is_offered_before_ps(tmp_path):
    env, job = killed_submit(tmp_path, "submit_answered")
    try:
        db = sqlite3.connect(tmp_path / "state" / "gpujob" / "state.db")
        assert db.execute("SELECT state FROM jobs").fetchall() == [("submitting",)]  # no ps yet
        db.close()
        assert tab_jobs(env) == [job]  # a real job: Tab offers it
    finally:
        assert cli(["stop", job], env).returncode == 0


def test_a_submit_going_on_in_another_shell_is_offered(tmp_path):
    """Its gpujob lives (this test's process reserved the row): not a phantom."""
    env = local_env(tmp_path)
    spec(tmp_path / "r")
    from gpujob.ops.state import State
    state = State(tmp_path / "state" / "gpujob" / "state.db")
    state.reserve("j-live", "j", "lab/box", str(tmp_path / "r" / "j.yaml"), "h", "base")
    state.close()
    assert tab_jobs(env) == ["j-live"]
