"""The lanes of bench/recipes_gpu/run.py: per trainer, the spec (``recipe: NAME`` and
the trainer's own command line, nothing the recipe fixes) and its tiny, download-free
model. On ``--device cpu`` (the rehearsal) the sizes shrink, attention is SDPA and
``broken`` sleeps after each step instead (a CPU has no compiled/eager gap to show).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
TRAINERS = HERE / "trainers"

# what every lane's judging uses: short windows for a run of minutes
THROUGHPUT = {"window": 5, "min_ratio": 0.7, "failure_limit": 2, "initial_delay": "5s",
              "no_data_timeout": "150s", "good_after": "20s", "settle": {"timeout": "60s"}}


# --init-keys: what `gpujob init` writes (min_ratio; tokens_per_step where the recipe needs it)
# and gpujob's defaults for every other judging key, but good_after, so that act 1's profile
# becomes known-good (and sets the baseline) in seconds instead of the default's 10 minutes
INIT_KEYS = {"min_ratio": 0.8, "good_after": "20s"}


def profiles(python: str, cpu: bool) -> list:
    broken_env = {"TORCHDYNAMO_DISABLE": "1"}
    if cpu:
        broken_env["BENCH_STEP_DELAY"] = "0.3"
    return [{"name": "compiled", "system_site_packages": True, "python": python},
            {"name": "broken", "system_site_packages": True, "python": python, "env": broken_env}]


def via_init(lane: "Lane", where: Path, args, command: str, **extra) -> tuple:
    """--via-init: the spec as a user gets it: ``gpujob init --recipe R -t lab/LANE -- COMMAND``
    run in the job's code folder (its sync entries, name and recipe keys are init's), then only
    the edits its CHANGE ME lines ask for: the profiles (compiled and broken on the base
    interpreter), tokens_per_step where the lane knows it; plus good_after 20s (act 1's
    profile known-good in seconds) and the lane's env. init's own file is kept as job.init.yaml."""
    import shlex
    import sys

    import yaml
    code = where / "code"
    init = code / "job.yaml"  # beside the files, as a user runs it: sync paths are relative to it
    p = subprocess.run([sys.executable, "-m", "gpujob.entry", "init", "--recipe", lane.recipe,
                        "-t", f"lab/{lane.name}", "-o", "job.yaml", "--", *shlex.split(command)],
                       cwd=code, capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, HOME=str(where / "init-home")))
    if p.returncode:
        from bench.gpu import BenchError
        raise BenchError(f"{lane.name}: gpujob init failed (exit {p.returncode}): "
                         f"{(p.stdout + p.stderr)[-600:]}")
    shutil.copy(init, where / "job.init.yaml")
    spec = yaml.safe_load(init.read_text())
    # init's comment: "add what else it reads": the lane's files init did not find (torchtitan's
    # tokenizer and data, named inside train.toml), listed in the figures as a hand edit
    synced = {Path(e["src"]).name for e in spec.get("sync") or []}
    added = sorted(p.name for p in code.iterdir()
                   if p.name not in synced and p.name not in ("__pycache__", "job.yaml"))
    spec.setdefault("sync", []).extend({"src": n, "dest": n} for n in added)
    spec["profiles"] = profiles(args.python, args.device == "cpu")
    th = spec.setdefault("throughput", {})
    th.update(extra.pop("throughput", {}), good_after="20s")
    spec.setdefault("env", {}).update({"PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false"},
                                      **extra.pop("env", {}))
    spec.update(extra)
    path = init
    path.write_text(json.dumps(spec, indent=1))  # JSON is YAML
    (where / "hand_edits.json").write_text(json.dumps({"sync_added": added, "profiles": "compiled, broken",
                                                       "throughput": th, "env": spec["env"]}))
    return path, []


def own_spec(lane: "Lane", where: Path, args, command: str, files: list, **extra) -> tuple:
    code = where / "code"
    code.mkdir(parents=True, exist_ok=True)
    for f in files:
        shutil.copy(f, code / Path(f).name)
    if getattr(args, "via_init", False):
        return via_init(lane, where, args, command, **extra)
    spec = {"recipe": lane.recipe, "name": f"r-{lane.name}", "target": f"lab/{lane.name}",
            "sync": [{"src": str(code), "dest": ".", "exclude": ["__pycache__"]}],
            "env": {"PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false"},
            "profiles": profiles(args.python, args.device == "cpu"), "profile": "compiled",
            "train": {"command": command, "grace": "20s", "checkpoint": {"every": "30s"}},
            "throughput": dict(INIT_KEYS if getattr(args, "init_keys", False) else THROUGHPUT,
                               **extra.pop("throughput", {})),
            "rollback": {"fallback": ["compiled"], "wait_for_checkpoint": True}}
    spec.update(extra)
    path = where / "job.yaml"
    path.write_text(json.dumps(spec, indent=1))  # JSON is YAML
    return path, []


def version_of(module: str, *beside: str) -> Callable:
    """The module's version under a python; with ``beside``: "V (name V, ...)" of those too."""
    code = ("import importlib, sys\nout = []\nfor n in sys.argv[1:]:\n    try:\n"
            "        out.append(importlib.import_module(n).__version__)\n    except Exception:\n"
            "        out.append('missing')\nif out[0] == 'missing':\n    sys.exit(1)\nprint(out[0] + (' (' + "
            "', '.join(f'{n} {v}' for n, v in "
            "zip(sys.argv[2:], out[1:])) + ')' if out[1:] else ''))")

    def probe(python: str) -> str | None:
        p = subprocess.run([python, "-c", code, module, *beside], capture_output=True, text=True, timeout=120)
        return p.stdout.strip().splitlines()[-1] if p.returncode == 0 and p.stdout.strip() else None
    return probe


@dataclass
class Lane:
    name: str
    recipe: str
    trainer: str
    build: Callable = field(repr=False)  # (lane, where, args) -> (spec path, --set list)
    version: Callable = field(repr=False)
    between: Callable | None = field(default=None, repr=False)

    def spec(self, where: Path, args) -> tuple:
        where.mkdir(parents=True, exist_ok=True)
        return self.build(self, where, args)

    def tokens_per_step(self, args) -> int | None:
        """The tokens of one step, where the trainer's counter counts steps (its rate's check)."""
        cpu = args.device == "cpu"
        if self.name == "lightning":
            return 2 * 64 if cpu else 16 * 1024
        if self.name == "torchtitan":
            from bench.recipes_gpu.torchtitan_tiny import SIZES
            _flavor, batch, seq, _every = SIZES["cpu" if cpu else "cuda"]
            return batch * seq
        return None

    def between_acts(self, root: Path) -> None:
        if self.between:
            self.between(root)


def _hf(lane, where, args):
    cpu = args.device == "cpu"
    size = ("--hidden_size 64 --num_layers 2 --num_heads 2 --vocab_size 256 --max_seq_length 64 "
            "--per_device_train_batch_size 2 --attn sdpa --use_cpu --save_steps 20"
            if cpu else "--hidden_size 384 --num_layers 6 --num_heads 6 --vocab_size 4096 "
            "--max_seq_length 1024 --per_device_train_batch_size 16 --bf16 --save_steps 200 "
            "--dataloader_num_workers 2")
    command = (f"python hf_train.py --output_dir out {size} --max_steps 1000000 --save_total_limit 2 "
               "--logging_steps 50 --report_to none")
    return own_spec(lane, where, args, command,
                    [TRAINERS / "hf_train.py", REPO / "bench" / "traces" / "hf_trainer.py"])


def _nanogpt(lane, where, args):
    cpu = args.device == "cpu"
    size = ("--device=cpu --attn=sdpa --compile=False --batch_size=2 --block_size=64 --n_layer=2 --n_head=2 "
            "--n_embd=64 --vocab_size=256 --eval_interval_s=8 --eval_iters=2"
            if cpu else "--batch_size=16 --block_size=1024 --n_layer=6 --n_head=6 --n_embd=384 "
            "--vocab_size=4096 --eval_interval_s=12 --eval_iters=5")
    # evals (and the in-place save of out/ckpt.pt after each) by the clock, the same on both
    # profiles: by iterations, broken (7x slower) would save its first only minutes in
    command = (f"python nanogpt_trainer.py --compile=True {size} --eval_interval=0 "
               f"--gradient_accumulation_steps=1 --time_limit=0")
    if cpu:
        command = command.replace("--compile=True ", "")
    return own_spec(lane, where, args, command, [REPO / "bench" / "traces" / "nanogpt_trainer.py"])


def _lightning(lane, where, args):
    cpu = args.device == "cpu"
    size = ("--trainer.accelerator cpu --model.dim 64 --model.layers 2 --model.heads 2 --model.seq 64 "
            "--model.vocab 256 --model.attn sdpa --model.compile false --data.batch_size 2 "
            "--trainer.callbacks.every_n_train_steps=20"
            # LightningEnvironment: without it Lightning imports mpi4py to detect an MPI cluster, and on
            # the device image (mpi4py, no MPI daemon) MPI_Init aborts the run before its first step
            if cpu else "--trainer.accelerator gpu --trainer.devices 1 --trainer.precision bf16-mixed "
            "--trainer.plugins=LightningEnvironment "
            "--model.dim 384 --model.layers 6 --model.heads 6 --model.seq 1024 --model.vocab 4096 "
            "--data.batch_size 16 --trainer.callbacks.every_n_train_steps=200")
    command = (f"python lightning_train.py fit --trainer.max_steps 1000000 --trainer.enable_model_summary "
               f"false --trainer.callbacks+=ModelCheckpoint {size}")
    tokens = 2 * 64 if cpu else 16 * 1024
    return own_spec(lane, where, args, command, [TRAINERS / "lightning_train.py"],
                    throughput={"tokens_per_step": tokens})


def _torchtitan(lane, where, args):
    """torchtitan 0.2.2 through torchrun (its module, torch.distributed.run, under the
    profile's python: a system-site-packages venv has no torchrun script of its own, and
    the one on PATH would start the base interpreter). Its tiny job (train.toml,
    tokenizer, data) is written into the job's code by torchtitan_tiny.py. On the CPU
    the entry is trainers/titan_cpu.py (torchtitan assumes CUDA) and nothing compiles."""
    from bench.gpu import BenchError
    from bench.recipes_gpu.torchtitan_tiny import build

    cpu = args.device == "cpu"
    code = where / "code"
    # TITAN_FLAVOR=debugmodel: SDPA in place of flex attention (no max-autotune of flex in the warmup)
    build(code, "cpu" if cpu else "cuda", flavor=os.environ.get("TITAN_FLAVOR"))
    # what torchtitan.train imports (torchdata, datasets, tyro, ...) and its loader on the tiny data,
    # under the base interpreter, in one line if either fails (else only the warmup's log would say)
    probe = ("import sys, tempfile, torchtitan.train, datasets; "
             "datasets.load_dataset(sys.argv[1], split='train', cache_dir=tempfile.mkdtemp())")
    p = subprocess.run([args.python, "-c", probe, str(code / "data")], capture_output=True, text=True,
                       timeout=300, env=dict(os.environ, HF_DATASETS_OFFLINE="1", HF_HUB_OFFLINE="1"))
    if p.returncode:
        last = (p.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise BenchError(f"torchtitan: importing torchtitan.train or loading its data failed under "
                         f"{args.python}: {last}")
    entry = "titan_cpu" if cpu else "torchtitan.train"
    command = (f"python -m torch.distributed.run --nproc_per_node 1 -m {entry} --job.config_file train.toml"
               + ("" if cpu else " --compile.enable"))
    # datasets' json builder reads the local data/; nothing may reach for a hub
    offline = {"HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"}
    if getattr(args, "via_init", False):
        return own_spec(lane, where, args, command, [TRAINERS / "titan_cpu.py"] if cpu else [], env=offline)
    path, sets = own_spec(lane, where, args, command, [TRAINERS / "titan_cpu.py"] if cpu else [])
    spec = json.loads(path.read_text())
    spec["env"].update(offline)
    path.write_text(json.dumps(spec, indent=1))
    return path, sets


LANES = {lane.name: lane for lane in (
    Lane("hf", "hf_trainer", "transformers", _hf, version_of("transformers")),
    Lane("nanogpt", "nanogpt", "nanoGPT-style (ours)", _nanogpt, version_of("torch")),
    Lane("lightning", "lightning", "lightning", _lightning, version_of("lightning")),
    Lane("torchtitan", "torchtitan", "torchtitan", _torchtitan,
         version_of("torchtitan", "datasets", "pyarrow", "fsspec", "tyro", "torchdata")),
)}
