"""gc's trash (agent/verbs/prune.py): what a gc killed at any moment leaves is finished by
the next one — a renamed checkpoint folder, its record, and a record's temp file (a death
between the temp file's write and its rename)."""

import json
import os

from gpujob.agent.home.journal import Home
from gpujob.agent.verbs import prune


def test_a_killed_gcs_leftovers_are_finished_the_temp_file_of_a_record_included(tmp_path):
    home = Home(str(tmp_path / "home"))
    trash = home.path(prune.TRASH)
    os.makedirs(trash)
    hidden = tmp_path / "work" / ".gc-step-100-7"
    hidden.mkdir(parents=True)
    (hidden / "model.pt").write_bytes(b"x")
    with open(os.path.join(trash, "ckpt-1.json"), "w") as f:
        json.dump({"path": str(hidden), "was": str(tmp_path / "work" / "step-100")}, f)
    open(os.path.join(trash, "ckpt-2.json.tmpk3j_x9"), "w").close()  # killed before its rename
    os.makedirs(os.path.join(trash, "job-abc-9", "logs"))
    done = prune.finish_leftovers(home)
    assert sorted(done) == sorted([str(hidden), os.path.join(trash, "job-abc-9")])
    assert os.listdir(trash) == [] and not hidden.exists()


def test_removing_a_checkpoint_leaves_no_record_and_no_temp_file(tmp_path):
    home = Home(str(tmp_path / "home"))
    ck = tmp_path / "work" / "step-100"
    ck.mkdir(parents=True)
    (ck / "model.pt").write_bytes(b"x")
    prune.remove_checkpoint(home, str(ck))
    assert not ck.exists() and os.listdir(home.path(prune.TRASH)) == []
    assert sorted(os.listdir(tmp_path / "work")) == []
