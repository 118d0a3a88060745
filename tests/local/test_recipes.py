"""Recipes, --set and init: pure merge rules, one-line errors, what the plan shows."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from gpujob.errors import InputError, SpecError
from gpujob.spec.recipes.registry import RECIPES, apply, merge
from gpujob.spec.recipe_init import job_name
from gpujob.spec.model import load_spec
from helpers import cli, gpujob_argv, local_env

BASE = {"name": "j", "target": "box", "profiles": [{"name": "base", "system_site_packages": True}]}


def write(tmp_path: Path, **data) -> Path:
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump({**BASE, **data}, sort_keys=False))
    return path


def test_merge_maps_merge_and_lists_replace():
    assert merge({"a": {"b": 1, "c": [1, 2]}, "d": 1}, {"a": {"c": [3]}, "e": 2}) == \
        {"a": {"b": 1, "c": [3]}, "d": 1, "e": 2}


def test_every_key_the_spec_sets_wins_over_the_recipe(tmp_path):
    spec = load_spec(write(tmp_path, recipe="specforge", train={
        "command": "specforge train -c run.yaml output_dir=out", "resume_args": ["x=1"],
        "checkpoint": {"path": "mine/*.pt", "every": "5m"}},
        throughput={"tokens_per_step": 900, "min_ratio": 0.8, "pattern": "(?P<value>\\d+) s/s"}))
    assert spec.train.resume_args == ["x=1"]
    assert spec.train.checkpoint.path == "mine/*.pt" and spec.train.checkpoint.every == 300
    assert spec.train.checkpoint.done_file is None  # the recipe's "finished" rule went with its path
    assert spec.throughput.pattern == "(?P<value>\\d+) s/s" and spec.throughput.format == "regex"
    assert spec.train.command.endswith("training.log_interval=10")  # the short log interval
    assert spec.train.standby is None  # a console script: the standby cannot run it
    came = spec._layers["recipe"]
    assert "train.resume_args" not in came and "throughput.format" in came
    assert "training.max_steps=3" in spec.warmup.command and "run_id=gpujob-warmup" in spec.warmup.command
    assert "training.save_interval=0" in spec.warmup.command


def test_specforge_recipe_with_python_m_gets_a_standby_and_its_paths(tmp_path):
    spec = load_spec(write(tmp_path, recipe="specforge", train={
        "command": "python -m specforge.cli train -c run.yaml output_dir={workdir}/o run_id=r "
                   "training.log_interval=5"}, throughput={"tokens_per_step": 512, "min_ratio": 0.8}))
    assert "training.log_interval=5 " in spec.train.command  # given: not appended again
    assert spec.train.command.count("training.log_interval") == 1
    assert spec.train.command.endswith("training.log_interval=5 output_dir={workdir}/o/{job_id}")
    assert (spec.train.checkpoint.path == "o/{job_id}/r-step*"
            and spec.train.checkpoint.done_file == "training_state.pt")
    assert spec.train.resume_args == ["training.resume_from={resume_from}"]
    assert spec.throughput.ranks == "first"
    assert "specforge.cli" in spec.train.standby.preload
    from gpujob.agent.judge.throughput import make_parser
    parse = make_parser("regex", pattern=spec.throughput.pattern, tokens_per_step=512)
    assert parse("[rank3]: step 40: {'loss': 1.2, 'perf/global_samples_per_second': 2.5, 'x': 1}") == 1280
    assert parse("step 40: {'loss': 1.2, 'perf/global_samples_per_second': 10.0}") == 5120


@pytest.mark.parametrize("recipe", ["specforge", "lightning"])
def test_tokens_per_step_required_in_one_line_at_the_recipe(tmp_path, recipe):
    path = write(tmp_path, recipe=recipe, train={"command": "python t.py"})
    with pytest.raises(SpecError) as e:
        load_spec(path)
    line = path.read_text().splitlines().index(f"recipe: {recipe}") + 1
    assert e.value.line == line and e.value.field == "throughput.tokens_per_step"
    assert "\n" not in str(e.value) and f"recipe {recipe}" in str(e.value)


def test_hf_tokens_per_step_read_from_the_command(tmp_path):
    spec = load_spec(write(tmp_path, recipe="hf_trainer", train={
        "command": "torchrun --nproc_per_node 4 run_clm.py --output_dir {workdir}/o "
                   "--per_device_train_batch_size 8 --max_seq_length 1024 --gradient_accumulation_steps 2"},
        throughput={"min_ratio": 0.8}))
    assert spec.throughput.tokens_per_step == 8 * 1024 * 2 * 4 and spec.throughput.format == "tqdm"
    assert spec.train.checkpoint.path == "o/{job_id}/checkpoint-*"  # an --output_dir per job
    assert spec.train.checkpoint.done_file == "trainer_state.json"
    assert spec.train.resume_args == ["--resume_from_checkpoint", "{resume_from}"]
    assert spec.throughput.pause_pattern == r"^\{'eval_loss'"
    with pytest.raises(SpecError, match="per_device_train_batch_size"):
        load_spec(write(tmp_path, recipe="hf_trainer", train={"command": "python t.py"}))


def test_unknown_recipe_is_one_line_with_a_suggestion(tmp_path):
    with pytest.raises(SpecError) as e:
        load_spec(write(tmp_path, recipe="specforg", train={"command": "python t.py"}))
    assert e.value.field == "recipe" and "did you mean 'specforge'" in str(e.value)


def test_every_recipe_says_what_it_was_read_from():
    for r in RECIPES.values():
        assert r.read_from and r.proven_on and r.revision >= 1
    assert apply({"name": "x"}) == ({"name": "x"}, {})
    import gpujob.spec.recipes.registry
    # every key a recipe should set, it sets
    assert not hasattr(gpujob.spec.recipes.registry, "RECIPE_PENDING_KEYS")


def test_job_json_spec_records_the_recipe_version(tmp_path):
    spec = load_spec(write(tmp_path, recipe="nanogpt", train={"command": "python train.py"},
                           throughput={"min_ratio": 0.8}))
    info = spec.to_agent_dict()["recipe_info"]
    assert info["name"] == "nanogpt" and info["revision"] == RECIPES["nanogpt"].revision
    assert info["proven_on"] == RECIPES["nanogpt"].proven_on


def test_set_replaces_values_before_the_recipe_and_errors_name_the_set(tmp_path):
    path = write(tmp_path, train={"command": "python a.py"})
    spec = load_spec(path, ["train.command=python b.py", "profiles.0.env={X: '1'}", "recipe=nanogpt",
                            "throughput.min_ratio=0.5", "throughput.format=ktok"])
    assert spec.train.command.startswith("python b.py") and spec.profiles[0].env == {"X": "1"}
    assert spec.recipe == "nanogpt" and spec.throughput.min_ratio == 0.5
    assert spec._layers["sets"][0] == ("train.command", "python a.py", "python b.py")
    with pytest.raises(InputError) as e:
        load_spec(path, ["throughput.window=zero"])
    assert str(e.value).startswith("--set throughput.window: throughput.window: expected a count (an "
                                   "integer) or a duration")
    for bad, want in (("nokey", "expected KEY=VALUE"), ("profiles.3.name=x", "has 1 items"),
                      ("name.x=1", "is not a mapping")):
        with pytest.raises(InputError, match=want):
            load_spec(path, [bad])


def test_plan_marks_recipe_keys_and_sets(tmp_path):
    env = local_env(tmp_path)
    path = write(tmp_path, recipe="nanogpt", train={"command": "python train.py"},
                 throughput={"min_ratio": 0.8})
    p = cli(["submit", str(path), "--plan", "--json", "--set", "train.grace=5s"], env, check=True)
    steps = json.loads(p.stdout)["steps"]
    whats = [s["what"] for s in steps if s["kind"] in ("recipe", "set")]
    assert '--set train.grace = "5s"' in whats
    assert any(w.startswith(f"recipe nanogpt (revision {RECIPES['nanogpt'].revision};") for w in whats)
    assert 'from recipe nanogpt: train.resume_args = ["--init_from=resume"]' in whats
    bad = cli(["submit", str(path), "--plan", "--set", "train.grace=-"], env)
    assert bad.returncode == 2 and bad.stderr.decode().count("\n") == 1 and "--set train.grace" in \
        bad.stderr.decode()


def test_recipes_json_lists_each_and_what_it_sets(tmp_path):
    p = cli(["recipes", "--json"], local_env(tmp_path), check=True)
    items = {r["name"]: r for r in json.loads(p.stdout)["recipes"]}
    assert set(items) == set(RECIPES)
    assert items["specforge"]["sets"]["throughput.format"] == "regex"
    assert items["nanogpt"]["sets"]["throughput.format"] == "regex"
    assert items["nanogpt"]["sets"]["throughput.tokens_per_step"] == 12 * 1024 * 40  # read, not given
    assert "given" not in items["nanogpt"] and \
        items["lightning"]["given"] == {"throughput.tokens_per_step": 4096}
    assert not any("pending_keys" in r for r in items.values())
    human = cli(["recipes"], local_env(tmp_path), check=True).stdout.decode()
    assert "(later)" not in human and 'train.resume_args: ["--ckpt_path", "{resume_from}"]' in human


@pytest.mark.parametrize("recipe", sorted(RECIPES))
def test_init_writes_a_spec_that_passes_submit_plan(tmp_path, recipe):
    env = local_env(tmp_path)
    out = tmp_path / "s.yaml"
    cli(["init", "--recipe", recipe, "--target", "box", "-o", str(out), "--", "python", "my_Train.py",
         "--lr", "1"], env, check=True)
    text = out.read_text()
    assert f"recipe: {recipe}" in text and "name: my-train" in text and "CHANGE ME" in text
    p = cli(["submit", str(out), "--plan"], env)
    assert p.returncode == 0, p.stderr.decode()
    again = cli(["init", "--recipe", recipe, "-o", str(out), "--", "python", "x.py"], env)
    assert again.returncode == 2 and "exists already" in again.stderr.decode()
    assert out.read_text() == text


def test_init_default_name_and_file(tmp_path):
    assert job_name(["python", "scripts/Train_DFlash.py"]) == "train-dflash"
    # a module's generic last part gives way to its package (issue 38 row 8)
    assert job_name(["python", "-m", "specforge.cli", "train"]) == "specforge"
    assert job_name(["torchrun", "--nproc_per_node", "8", "-m", "torchtitan.train"]) == "torchtitan"
    assert job_name(["python", "-m", "torch.distributed.run", "-m", "torchtitan.train"]) == "torchtitan"
    env = local_env(tmp_path)
    import subprocess
    p = subprocess.run([*gpujob_argv(), "init", "--recipe", "nanogpt", "--",
                        "python", "train.py"], cwd=tmp_path, env=env, capture_output=True)
    assert p.returncode == 0, p.stderr.decode()
    assert (tmp_path / "train.yaml").exists()


def test_no_deps_requirement_is_its_own_install_step_in_the_plan(tmp_path):
    env = local_env(tmp_path)
    path = write(tmp_path, train={"command": "python t.py"},
                 profiles=[{"name": "p", "index_url": "https://download.pytorch.org/whl/cu128",
                            "packages": ["torch==2.11.0+cu128"]}],
                 requirements=["pydantic", {"package": "specforge==0.2.0", "no_deps": True}])
    spec = load_spec(path)
    key = spec.env_key("p")
    steps = json.loads(cli(["submit", str(path), "--plan", "--json"], env, check=True).stdout)["steps"]
    installs = [s["argv"] for s in steps if s["kind"] == "env" and "install" in s["argv"]]
    assert installs[1][-1] == "pydantic" and "specforge==0.2.0" not in installs[1]
    assert installs[2][-2:] == ["--no-deps", "specforge==0.2.0"] and "-c" in installs[2]
    # the venv's key counts it: a changed no-deps package is another venv
    path.write_text(path.read_text().replace("specforge==0.2.0", "specforge==0.2.1"))
    assert load_spec(path).env_key("p") != key
    for bad, want in (({"package": "x", "no_deps": False}, "expected true"),
                      ({"package": "x", "deps": True}, "unknown field")):
        path = write(tmp_path, train={"command": "python t.py"}, requirements=[bad])
        with pytest.raises(SpecError, match=want):
            load_spec(path)


def test_a_spec_null_removes_a_recipe_section_and_the_plan_does_not_claim_it(tmp_path):
    spec = load_spec(write(tmp_path, recipe="nanogpt", warmup=None, train={"command": "python train.py"},
                           throughput=None))
    assert spec.warmup is None and spec.throughput is None
    assert not any(k.startswith(("warmup", "throughput")) for k in spec._layers["recipe"])


def test_doctor_spec_warns_on_another_trainer_version(tmp_path):
    from gpujob.ops.doctor_recipe import judge
    [ok] = judge("specforge", {"p": "0.2.0"})
    [other] = judge("hf_trainer", {"p": "4.57.1"})
    [none] = judge("hf_trainer", {"p": None})
    assert ok.status.value == "ok" and other.status.value == "warn" and none.status.value == "ok"
    assert "transformers 4.57.1 is installed" in other.detail and "5.8.1, 5.17" in other.detail
    assert judge("hf_trainer", {"p": "5.17.2"})[0].status.value == "ok"
    # through the CLI on the local kind: a built venv whose trainer is another version
    env = local_env(tmp_path)
    path = write(tmp_path, recipe="hf_trainer", train={"command": "python t.py"}, throughput={
        "tokens_per_step": 10, "min_ratio": 0.8})
    key = load_spec(path).env_key("base")
    fake = tmp_path / "root" / "envs" / key / "bin" / "python"
    fake.parent.mkdir(parents=True)
    fake.write_text("#!/bin/sh\necho 4.57.1\n")
    fake.chmod(0o755)
    p = cli(["doctor", "--spec", str(path), "--json"], env)
    checks = {c["name"]: c for c in json.loads(p.stdout)["lab/box"]}
    assert checks["recipe base"]["status"] == "warn" and "4.57.1" in checks["recipe base"]["detail"]


def test_profile_names_a_profile_that_a_set_brought_in_place_of_the_specs_own(tmp_path):
    """Running the shipped jobs/dflash.yaml on other wheels by --set alone (the H200 run):
    with its profiles replaced, its own `profile: cu128` names none of them; --profile
    names one, and the spec is not refused for the name it had."""
    env = local_env(tmp_path)
    spec = Path(__file__).resolve().parents[2] / "jobs" / "dflash.yaml"
    sets = ["--set", "profiles=[{name: compiled, system_site_packages: true}, {name: broken, "
            "system_site_packages: true, env: {TORCHDYNAMO_DISABLE: '1'}}]", "--set",
            "rollback.fallback=[compiled]", "--set", "requirements=[]"]
    p = cli(["submit", str(spec), "-t", "box", "--plan", "--profile", "broken", *sets], env)
    assert p.returncode == 0, p.stderr.decode()
    assert "profile broken" in p.stdout.decode()
    p = cli(["submit", str(spec), "-t", "box", "--plan", "--profile", "nope", *sets], env)
    assert p.returncode != 0 and "nope" in p.stderr.decode() and "Traceback" not in p.stderr.decode()


def _titan(command: str) -> dict:
    return RECIPES["torchtitan"].derive({"train": {"command": command}})


def test_torchtitan_03_dump_folder_flag_and_a_warmup_its_parser_accepts():
    """torchtitan 0.3 (--module/--config, no TOML) names the dump folder --dump_folder and
    refuses --job.dump_folder: the checkpoint path is read from it and the warmup uses it."""
    frag = _titan("torchrun --nproc_per_node 1 -m torchtitan.train --module llama3 --config "
                  "llama3_debugmodel --dump_folder out")
    assert frag["train"]["checkpoint"]["path"] == "out/checkpoint/{job_id}/step-*"
    warm = frag["warmup"]["command"]
    assert "--dump_folder {workdir}/gpujob-warmup" in warm and "--job." not in warm
    old = _titan("torchrun -m torchtitan.train --job.config_file train.toml --job.dump_folder out")
    assert old["train"]["checkpoint"]["path"] == "out/checkpoint/{job_id}/step-*"
    assert "--job.dump_folder {workdir}/gpujob-warmup" in old["warmup"]["command"]


def test_torchtitan_saves_and_its_warmup_does_not():
    """torchtitan saves only with checkpoint.enable (off by default): the recipe turns it on,
    or there is nothing to resume from; the warmup turns it off (tyro: the last flag wins),
    or a second warmup in the same folder loads the first's step-3 and trains no step."""
    frag = _titan("torchrun -m torchtitan.train --job.config_file train.toml")
    assert frag["train"]["command"].split()[-5:] == ["--checkpoint.enable", "--checkpoint.folder",
                                                     "checkpoint/{job_id}", "--metrics.log_freq", "1"]
    assert frag["warmup"]["command"].endswith("--checkpoint.no-enable")
    for own in ("--checkpoint.enable", "--checkpoint.no-enable"):
        cmd = (f"torchrun -m torchtitan.train --job.config_file train.toml {own} --metrics.log_freq 5 "
               "--checkpoint.folder ck")
        assert "command" not in _titan(cmd)["train"]  # the spec's own choice stays as it is


def test_torchtitan_never_loads_an_earlier_jobs_checkpoint_and_enables_saving_once():
    """Issue 38 rows 4 and 8: torchtitan loads the newest step-N of its checkpoint folder by
    itself, at a fresh start too; each job gets a folder of its own, and the resume command
    does not carry --checkpoint.enable a second time."""
    frag = _titan("torchrun -m torchtitan.train --job.config_file train.toml")
    assert "--checkpoint.folder checkpoint/{job_id}" in frag["train"]["command"]
    assert frag["train"]["checkpoint"]["path"] == "outputs/checkpoint/{job_id}/step-*"
    # it loads this job's newest by itself; a resume names the chosen one for a job that has none
    # of its own yet (submit --resume-from): tests/unit/test_recipe_resume_args.py
    loads = ["--checkpoint.initial_load_path", "{resume_from}", "--checkpoint.no_initial_load_model_only"]
    assert frag["train"]["resume_args"] == loads
    assert frag["train"]["command"].count("--checkpoint.enable") == 1
    off = _titan("torchrun -m torchtitan.train --job.config_file train.toml --checkpoint.no-enable")
    assert off["train"]["resume_args"] == ["--checkpoint.enable", *loads]


def test_init_writes_a_launcher_that_starts_and_doctor_spec_says_when_the_program_is_not_on_path(tmp_path):
    """Issue 38 row 5: `torchrun` is a console script a base profile may not have on the job's
    PATH: init writes `python -m torch.distributed.run`, and doctor --spec fails a command whose
    program the profile's PATH does not hold."""
    import sys
    from gpujob.spec.recipe_init import spec_text
    text = spec_text("torchtitan", ["torchrun", "--nproc_per_node", "1", "-m", "torchtitan.train"], name="t",
                     target="box")
    assert 'command: "python -m torch.distributed.run --nproc_per_node 1 -m torchtitan.train' in text
    env = local_env(tmp_path)
    for command, status in (("gpujob-no-such-launcher --nproc_per_node 1 x.py", "fail"),
                            ("OMP_NUM_THREADS=1 python t.py", "ok")):
        path = write(tmp_path, recipe="hf_trainer", train={"command": command}, throughput={
            "tokens_per_step": 10, "min_ratio": 0.8})
        key = load_spec(path).env_key("base")
        py = tmp_path / "root" / "envs" / key / "bin" / "python"
        py.parent.mkdir(parents=True, exist_ok=True)
        if not py.exists():
            py.symlink_to(sys.executable)  # a built venv's python
        p = cli(["doctor", "--spec", str(path), "--json"], env)
        checks = {c["name"]: c for c in json.loads(p.stdout)["lab/box"]}
        assert checks["program base"]["status"] == status, checks["program base"]
        if status == "fail":
            assert (p.returncode == 1
                    and "not on the job's PATH in profile base" in checks["program base"]["detail"])


def test_plan_warns_of_a_save_interval_beyond_the_run_when_a_rollback_waits_for_a_checkpoint(tmp_path):
    """Issue 38 row 6: HF with --save_steps beyond --max_steps and wait_for_checkpoint: --plan says a
    decided rollback would wait the whole hold limit."""
    env = local_env(tmp_path)
    cmd = "python run_clm.py --output_dir out --per_device_train_batch_size 2 --max_seq_length 64 " \
          "--save_steps 5000 --max_steps 600"
    path = write(tmp_path, recipe="hf_trainer", train={"command": cmd},
                 rollback={"wait_for_checkpoint": True}, throughput={"min_ratio": 0.8})
    p = cli(["submit", str(path), "-t", "box", "--plan"], env)
    assert p.returncode == 0, p.stderr.decode()
    text = " ".join(p.stdout.decode().split())
    assert "the command saves every 5000 steps (--save_steps) and runs 600" in text
    assert "waits the whole hold limit (1860s" in text
