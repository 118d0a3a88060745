"""Shell completion without the full CLI (issue 24): a Tab is answered by gpujob/complete.py
from the generated index (gpujob/complete_table.py), the inventory and the laptop's job
index. It lists commands and options as typer's completion does, and also target names,
job ids and fixed choices, which typer's did not; it imports neither typer nor rich."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gpujob import complete_table
from helpers import GPUJOB, REPO, local_env

# word lines whose answer has no value from this laptop: typer's answer is the reference
TYPER_CASES = ["gpujob ", "gpujob lo", "gpujob logs --fo", "gpujob logs -", "gpujob logs -f -",
               "gpujob cache c",
               "gpujob cache ", "gpujob ledger ", "gpujob --hosts x st", "gpujob exec x -- ",
               "gpujob exec x -- -",
               "gpujob submit --", "gpujob ps --limit 3 -", "gpujob logs --tail=", "gpujob nosuch ",
               "gpujob -"]


def run_complete(shell: str, words: str, env: dict, *, full: bool = False) -> subprocess.CompletedProcess:
    """One completion call-back as the shell makes it; ``full``: through typer's machinery
    (the CLI module itself, which never takes the fast path)."""
    e = dict(env, _GPUJOB_COMPLETE=f"complete_{shell}")
    if shell == "bash":
        parts = words.split()
        e.update(COMP_WORDS=words, COMP_CWORD=str(len(parts) if words.endswith(" ") else len(parts) - 1))
    else:
        e.update(_TYPER_COMPLETE_ARGS=words, _TYPER_COMPLETE_FISH_ACTION="get-args")
    argv = [sys.executable, "-m", "gpujob.cli.main"] if full else [str(GPUJOB)]
    return subprocess.run(argv, env=e, capture_output=True, cwd=str(REPO), timeout=120)


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """A local inventory (lab/box, and `box` on a second host too) and two jobs in the index."""
    tmp = tmp_path_factory.mktemp("complete")
    env = local_env(tmp)
    (tmp / "hosts.yaml").write_text("hosts:\n  lab: {kind: local, containers: {box: {root: /tmp/x}, gpu1: "
                                    "{root: /tmp/y}}}\n  lab2: {kind: local, containers: {box: {root: "
                                    "/tmp/z}}}\n")
    code = ("from gpujob.ops.state import State\ns = State()\n"
            "s.reserve('train-aaaa', 'train', 'lab/gpu1', 'job.yaml', 'h', 'fast')\n"
            "s.reserve('train-bbbb', 'train', 'lab/gpu1', 'job.yaml', 'h', 'fast')\n"
            "s.seen('train-aaaa', 'training')\ns.seen('train-bbbb', 'training')\n"  # submitted: not phantoms
            "s.close()\n")
    subprocess.run([sys.executable, "-c", code], env=env, check=True, cwd=str(REPO))
    return env


def test_the_index_is_the_clis():
    from gpujob.cli import complete_index
    assert complete_index.current() == complete_table.TABLE, \
        "the CLI's commands changed: run python -m gpujob.cli.complete_index"


@pytest.mark.parametrize("shell", ["bash", "zsh", "fish"])
def test_commands_and_options_as_typer_lists_them(lab, shell):
    for words in TYPER_CASES:
        fast, full = run_complete(shell, words, lab), run_complete(shell, words, lab, full=True)
        assert (fast.returncode, fast.stdout) == (full.returncode, full.stdout), words


def test_bash_tab_completes_targets_job_ids_and_choices(lab):
    """Through a real bash: the script `gpujob completion bash` prints, its function called
    as bash calls it on a Tab."""
    bash = shutil.which("bash")
    assert bash, "bash is needed for this test"
    env = dict(lab, PATH=f"{Path(GPUJOB).parent}:{lab['PATH']}")
    lines = ["gpujob exec ", "gpujob exec g", "gpujob exec lab2/", "gpujob logs ", "gpujob stop train-b",
             "gpujob submit job.yaml --resume-from ", "gpujob logs --phase ", "gpujob completion z",
             "gpujob ledger set box train fast ", "gpujob init --recipe n", "gpujob status -t l"]
    script = ('eval "$(gpujob completion bash)"\n'
              'while IFS= read -r words; do\n'
              '  read -ra COMP_WORDS <<< "$words"; COMP_CWORD=$(( ${#COMP_WORDS[@]} - 1 ))\n'
              '  [ "${words% }" != "$words" ] && COMP_CWORD=${#COMP_WORDS[@]}\n'
              '  _gpujob_completion gpujob; echo "${COMPREPLY[*]}"\ndone\n')
    p = subprocess.run([bash, "--norc", "-c", script], env=env, capture_output=True, timeout=60,
                       input="\n".join(lines).encode() + b"\n")
    assert p.stdout.decode().splitlines() == [
        "gpu1 lab/box lab/gpu1 lab2/box", "gpu1", "lab2/box",
        "train-bbbb train-aaaa", "train-bbbb", "train-bbbb train-aaaa",
        "warmup train prepare", "zsh", "good bad untried", "nanogpt",
        "lab/box lab/gpu1 lab2/box"], p.stderr.decode()


def test_a_tab_imports_neither_typer_nor_rich(lab):
    e = dict(lab, _GPUJOB_COMPLETE="complete_bash", COMP_WORDS="gpujob exec ", COMP_CWORD="2")
    p = subprocess.run([sys.executable, "-X", "importtime", str(GPUJOB)], env=e, capture_output=True,
                       cwd=str(REPO), timeout=60)
    assert p.stdout.decode().split() == ["gpu1", "lab/box", "lab/gpu1", "lab2/box"]
    loaded = {ln.split("|")[-1].strip().split(".")[0] for ln in p.stderr.decode().splitlines()
              if ln.startswith("import time:")}
    assert not loaded & {"typer", "rich", "pydantic", "paramiko"}, loaded & {"typer", "rich", "pydantic",
                                                                             "paramiko"}


def test_a_broken_inventory_or_index_offers_nothing_and_never_a_traceback(lab, tmp_path):
    (tmp_path / "bad.yaml").write_text("hosts: [\n")
    state = tmp_path / "state" / "gpujob"
    state.mkdir(parents=True)
    (state / "state.db").write_bytes(b"not a database")
    env = dict(lab, GPUJOB_HOSTS=str(tmp_path / "bad.yaml"), XDG_STATE_HOME=str(tmp_path / "state"))
    for words in ("gpujob exec ", "gpujob logs "):
        p = run_complete("bash", words, env)
        assert (p.returncode, p.stdout, p.stderr) == (0, b"\n", b""), words


def test_a_name_with_a_control_character_or_space_is_never_offered(lab, tmp_path):
    """hosts.yaml is read here without the inventory's checks: a container name that would end
    or split a completion line (which the inventory refuses anyway) is left out."""
    (tmp_path / "hosts.yaml").write_text('hosts:\n  lab:\n    kind: local\n    root: /tmp/x\n    '
                                         'containers:\n      "ok1": {}\n      "bad\\nname": {}\n      "two '
                                         'words": {}\n'
                                         '      "esc\\e[31m": {}\n')
    env = dict(lab, GPUJOB_HOSTS=str(tmp_path / "hosts.yaml"))
    p = run_complete("bash", "gpujob exec ", env)
    offered = p.stdout.decode().split()
    assert p.returncode == 0 and "ok1" in offered and "lab/ok1" in offered, offered
    assert not any("bad" in v or "two" in v or "words" in v or "esc" in v for v in offered), offered
