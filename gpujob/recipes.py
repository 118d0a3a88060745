"""Recipes: what a trainer's conventions fix, filled into a spec (`recipe: NAME`).

Pure: a spec's data (as loaded from YAML) in, the data with the recipe's keys
merged under it out, plus the dotted keys that came from the recipe (the plan
marks them). Every key the spec sets wins: mappings merge key by key, lists and
scalars are replaced whole.

A recipe's keys are partly fixed (a throughput pattern) and partly derived from
the spec's own train command (the warmup is the trainer itself for a few steps,
the checkpoint path follows its output directory, tokens per step its batch
arguments where they can be read). Where tokens per step cannot be read, the
spec must give ``throughput.tokens_per_step``: one line says so.
"""

from __future__ import annotations

import copy
import re
import shlex
from dataclasses import dataclass, field
from typing import Any, Callable

NOT_PROVEN = "not yet proven on a GPU"


class RecipeError(ValueError):
    """A spec that a recipe cannot complete: (dotted key, message)."""

    def __init__(self, key: str, message: str):
        super().__init__(message)
        self.key = key


def _argv(command) -> list:
    if isinstance(command, list):
        return [str(a) for a in command]
    try:
        return shlex.split(command or "")
    except ValueError:
        return str(command or "").split()


_SAFE = re.compile(r"[A-Za-z0-9_./=:+,@%{}-]+")


def _append(command, args: list):
    """The command with ``args`` appended (a string gets them shell-quoted; a word of
    safe characters stays as it is, so a ``{workdir}`` placeholder is left bare for
    gpujob to quote when it substitutes it)."""
    if isinstance(command, list):
        return list(command) + args
    words = " ".join(a if _SAFE.fullmatch(a) else shlex.quote(a) for a in args)
    return f"{command} {words}" if args else command


def flag(argv: list, *names: str) -> str | None:
    """The value of ``--name V`` / ``--name=V`` (the last one given), else None."""
    found = None
    for i, a in enumerate(argv):
        for n in names:
            if a == n and i + 1 < len(argv):
                found = argv[i + 1]
            elif a.startswith(n + "="):
                found = a[len(n) + 1:]
    return found


def dotted(argv: list, key: str) -> str | None:
    """A SpecForge-style ``key=value`` override (the last one), else None."""
    found = None
    for a in argv:
        if a.startswith(key + "="):
            found = a[len(key) + 1:]
    return found


def _int(text: str | None) -> int | None:
    return int(text) if text is not None and re.fullmatch(r"\d+", text) else None


def _standby(command, preload: list) -> dict:
    from gpujob.agent.base.placeholders import command_script
    return {"standby": {"preload": preload}} if command_script(command) is not None else {}


def own_rate(data: dict, fmt: str) -> bool:
    """Whether the spec reads its rate another way (its own ``throughput.format`` or a
    metrics file): then the recipe's rate keys (format, pattern, tokens per step) yield."""
    tp = data.get("throughput") or {}
    return isinstance(tp, dict) and (tp.get("source") == "file" or tp.get("format") not in (None, fmt))


#: The standby's preloads (agent/standby.py): what a fresh interpreter of each trainer
#: imports before its first step. Each module's import must touch no GPU and need
#: nothing beyond the trainer's own path (SpecForge's listed modules import only torch
#: and pydantic at their top level: sglang, yunchang and wandb stay unimported).
_COMPILE = ["torch", "torch._dynamo", "torch._inductor.compile_fx"]
PRELOAD = {
    "specforge": _COMPILE + ["torch.nn.attention.flex_attention", "transformers", "accelerate.utils",
                             "specforge.cli", "specforge.application", "specforge.training.trainer",
                             "specforge.algorithms.dflash"],
    "hf_trainer": _COMPILE + ["transformers", "transformers.trainer"],
    "nanogpt": _COMPILE + ["numpy", "torch.distributed", "torch.nn.parallel"],
    "lightning": ["torch", "lightning", "lightning.pytorch", "lightning.pytorch.cli"],
}


@dataclass(frozen=True)
class Recipe:
    name: str
    trainer: str  # the package (or project) whose conventions these are
    revision: int  # this recipe's own version: job.json records it
    read_from: str  # the trainer versions the conventions were read from
    proven_on: str  # the versions a GPU run proved (NOT_PROVEN until the device run)
    summary: str
    derive: Callable[[dict], dict] = field(repr=False)  # the spec's data -> the recipe's fragment
    versions: tuple = ()  # the trainer's versions these conventions hold for: doctor --spec warns on others

    def version_note(self, installed: str | None) -> str | None:
        """None when ``installed`` is a version these conventions hold for (a listed
        version or a release of it: 5.17 covers 5.17.x); else why doctor warns."""
        if installed is None or not self.versions:
            return None
        if any(installed == v or installed.startswith(v + ".") for v in self.versions):
            return None
        return (f"{self.trainer} {installed} is installed; recipe {self.name} (revision {self.revision}) "
                f"holds for {', '.join(self.versions)} ({self.proven_on})")

    def info(self) -> dict:
        return {"name": self.name, "trainer": self.trainer, "revision": self.revision,
                "read_from": self.read_from, "proven_on": self.proven_on}


# ---- SpecForge ---------------------------------------------------------------

SPECFORGE_PATTERN = r"^(?:\[?rank\d+\]?:\s*)?step (?P<step>\d+): \{.*'perf/global_samples_per_second': " \
                    r"(?P<value>[0-9.eE+-]+)"


def _specforge(data: dict) -> dict:
    command = (data.get("train") or {}).get("command")
    argv = _argv(command)
    out_dir = dotted(argv, "output_dir") or "output"
    run_id = dotted(argv, "run_id") or "specforge-run"
    rel = out_dir.replace("{workdir}/", "").rstrip("/")
    # A checkpoint is the directory {run_id}-stepN; rank 0 writes training_state.pt into it
    # after its own training_state_rank0.pt (each by rename), and training.resume_from takes
    # the directory gpujob chose (this job's newest finished). With more than one rank the
    # others' training_state_rank{r}.pt are renamed in during the same collective save, with
    # no barrier before rank 0's done file: so a checkpoint is finished when the done file is
    # there and nothing in the directory has changed for `settle` seconds (the register's
    # rule for every done_file). Run on one GPU; the multi-rank order is from SpecForge
    # 0.2.0's training/checkpoint.py.
    train: dict = {"checkpoint": {"path": f"{rel}/{run_id}-step*", "done_file": "training_state.pt",
                                  "every": "15m"},
                   "resume_args": ["training.resume_from={resume_from}"]}
    if dotted(argv, "training.log_interval") is None:
        train["command"] = _append(command, ["training.log_interval=10"])
    train.update(_standby(command, PRELOAD["specforge"]))
    warm = _append(train.get("command", command),
                   ["training.max_steps=3", "training.save_interval=0", "training.eval_interval=0",
                    "output_dir={workdir}/gpujob-warmup", "run_id=gpujob-warmup"])
    frag = {"train": train, "warmup": {"command": warm, "when": "cold", "timeout": "30m"}}
    if own_rate(data, "regex"):
        return frag
    if "tokens_per_step" not in (data.get("throughput") or {}):
        raise RecipeError("throughput.tokens_per_step", "missing (required) for recipe specforge: the mean "
                          "tokens per sample of data.hidden_states_path (SpecForge logs samples/s)")
    # every rank prints the same global rate: one rank's line is the sample
    return dict(frag, throughput={"format": "regex", "pattern": SPECFORGE_PATTERN, "ranks": "first"})


# ---- HF transformers.Trainer -------------------------------------------------

HF_EVAL_PATTERN = r"^\{'eval_loss'"


def _nproc(argv: list) -> int:
    return _int(flag(argv, "--nproc_per_node", "--nproc-per-node")) or 1


def _hf(data: dict) -> dict:
    command = (data.get("train") or {}).get("command")
    argv = _argv(command)
    out_dir = (flag(argv, "--output_dir", "--output-dir") or "output").replace("{workdir}/", "").rstrip("/")
    tput = dict(data.get("throughput") or {})
    frag: dict = {"throughput": {"pause_pattern": HF_EVAL_PATTERN}}  # an evaluation's metrics line
    if not own_rate(data, "tqdm"):
        frag["throughput"]["format"] = "tqdm"  # the bar's it/s
        if "tokens_per_step" not in tput:
            bs = _int(flag(argv, "--per_device_train_batch_size"))
            seq = _int(flag(argv, "--max_seq_length", "--max_length", "--block_size"))
            ga = _int(flag(argv, "--gradient_accumulation_steps")) or 1
            if not (bs and seq):
                raise RecipeError("throughput.tokens_per_step", "missing (required) for recipe hf_trainer: the "
                                  "command gives no --per_device_train_batch_size and --max_seq_length (or "
                                  "--block_size) to compute it from")
            frag["throughput"]["tokens_per_step"] = bs * seq * ga * _nproc(argv)
    # A checkpoint is the directory checkpoint-N; trainer_state.json is the last file a save
    # writes: its presence is the "finished" rule. --resume_from_checkpoint gets the
    # directory gpujob chose (HF's example scripts would otherwise take the newest of
    # --output_dir by themselves, an earlier job's included).
    train: dict = {"checkpoint": {"path": f"{out_dir}/checkpoint-*", "done_file": "trainer_state.json",
                                  "every": "15m"},
                   "resume_args": ["--resume_from_checkpoint", "{resume_from}"]}
    train.update(_standby(command, PRELOAD["hf_trainer"]))
    warm = _append(command, ["--max_steps", "3", "--save_strategy", "no", "--report_to", "none",
                             "--output_dir", "{workdir}/gpujob-warmup"])
    frag.update(train=train, warmup={"command": warm, "when": "cold", "timeout": "30m"})
    return frag


# ---- nanoGPT -----------------------------------------------------------------

NANOGPT_PATTERN = r"^iter (?P<step>\d+): loss [0-9.]+, time (?P<ms>[0-9.]+)ms"
NANOGPT_EVAL_PATTERN = r"^step \d+: train loss"  # its eval (then a save): the next iter's time holds both


def nanogpt_tokens(argv: list) -> int | None:
    """nanoGPT's tokens per iteration: gradient_accumulation_steps x batch_size x
    block_size over all processes (it divides gradient_accumulation_steps by the world
    size, so the product is the same for any number). Its defaults are 40, 12, 1024;
    None when a config file is given (``train.py config/x.py``: its values are not read)
    and the command does not give all three."""
    keys = ("--gradient_accumulation_steps", "--batch_size", "--block_size")
    given = [_int(flag(argv, k)) for k in keys]
    script = next((i for i, a in enumerate(argv) if a.endswith(".py")), None)
    config = script is not None and any(a.endswith(".py") and not a.startswith("-") for a in argv[script + 1:])
    if config and not all(given):
        return None
    ga, bs, block = (v or d for v, d in zip(given, (40, 12, 1024)))
    return ga * bs * block


def _nanogpt(data: dict) -> dict:
    command = (data.get("train") or {}).get("command")
    argv = _argv(command)
    out_dir = (flag(argv, "--out_dir") or "out").replace("{workdir}/", "").rstrip("/")
    # one out/ckpt.pt, rewritten in place by torch.save (no rename): finished once it has
    # not changed for 5 s
    train: dict = {"checkpoint": {"path": f"{out_dir}/ckpt.pt", "every": "15m", "settle": "5s"},
                   "resume_args": ["--init_from=resume"]}
    train.update(_standby(command, PRELOAD["nanogpt"]))
    if flag(argv, "--log_interval") is None:
        train["command"] = _append(command, ["--log_interval=1"])
    warm = _append(train.get("command", command), ["--max_iters=3", "--eval_interval=1000000",
                                                   "--always_save_checkpoint=False",
                                                   "--out_dir={workdir}/gpujob-warmup"])
    frag = {"train": train, "warmup": {"command": warm, "when": "cold", "timeout": "30m"},
            "throughput": {"pause_pattern": NANOGPT_EVAL_PATTERN}}
    if own_rate(data, "regex"):
        return frag
    tput: dict = {"format": "regex", "pattern": NANOGPT_PATTERN, "pause_pattern": NANOGPT_EVAL_PATTERN}
    if "tokens_per_step" not in (data.get("throughput") or {}):
        tokens = nanogpt_tokens(argv)
        if tokens is None:
            raise RecipeError("throughput.tokens_per_step", "missing (required) for recipe nanogpt: a config "
                              "file is given and the command does not give all of --gradient_accumulation_steps, "
                              "--batch_size and --block_size (its tokens per iteration)")
        tput["tokens_per_step"] = tokens
    return dict(frag, throughput=tput)


# ---- torchtitan --------------------------------------------------------------

def _torchtitan(data: dict) -> dict:
    command = (data.get("train") or {}).get("command")
    argv = _argv(command)
    # 0.2 (--job.config_file X.toml) names its dump folder --job.dump_folder; 0.3 (--module M
    # --config F, a Python config registry) --dump_folder, and refuses the other
    dump = "--dump_folder" if flag(argv, "--job.config_file") is None and (
        flag(argv, "--module", "--dump_folder") is not None) else "--job.dump_folder"
    folder = flag(argv, dump) or "outputs"
    ck = flag(argv, "--checkpoint.folder") or "checkpoint"
    rel = folder.replace("{workdir}/", "").rstrip("/")
    # DCP writes a step-N directory; .metadata is its last file (the "finished" rule)
    train: dict = {"checkpoint": {"path": f"{rel}/{ck}/step-*", "done_file": ".metadata", "every": "15m"},
                   # torchtitan loads the newest step-N of its checkpoint folder by itself
                   "resume_args": ["--checkpoint.enable"]}
    # it saves only with checkpoint.enable (off by default): on, or there is nothing to resume from
    add = [] if {"--checkpoint.enable", "--checkpoint.no-enable", "--checkpoint.no_enable"} & set(argv) \
        else ["--checkpoint.enable"]
    add += [] if flag(argv, "--metrics.log_freq") is not None else ["--metrics.log_freq", "1"]
    if add:
        train["command"] = _append(command, add)
    # saving off in the warmup: with it on, a second warmup in the same folder loads the
    # first one's step-3 and trains no step (and a big model's last-step save is slow)
    warm = _append(train.get("command", command), ["--training.steps", "3", dump, "{workdir}/gpujob-warmup",
                                                   "--checkpoint.no-enable"])
    frag = {"train": train, "warmup": {"command": warm, "when": "cold", "timeout": "30m"}}
    # every rank prints its own tps (tokens/s per device): the first rank's line is the
    # sample, so min and a given baseline are per device (scope per_gpu scales it by the GPUs)
    return frag if own_rate(data, "torchtitan") else dict(frag, throughput={"format": "torchtitan",
                                                                             "ranks": "first"})


# ---- Lightning ---------------------------------------------------------------

#: LightningCLI's progress bar that prints while it runs without a terminal: with rich
#: installed (gpujob's own dependency, and in the CUDA images) Lightning picks its
#: RichProgressBar, which draws nothing into a pipe until the run ends.
LIGHTNING_BAR = "--trainer.callbacks+=TQDMProgressBar"


def _lightning(data: dict) -> dict:
    command = (data.get("train") or {}).get("command")
    argv = _argv(command)
    rate = not own_rate(data, "tqdm_steps")
    if rate and "tokens_per_step" not in (data.get("throughput") or {}):
        raise RecipeError("throughput.tokens_per_step", "missing (required) for recipe lightning: its "
                          "progress bar counts steps (it/s), and a LightningModule's batch is not read from "
                          "the command")
    root = (flag(argv, "--trainer.default_root_dir") or "lightning_logs").replace("{workdir}/", "").rstrip("/")
    path = f"{root}/version_*/checkpoints/*.ckpt" if root == "lightning_logs" else f"{root}/**/checkpoints/*.ckpt"
    # Each run logs into a new version_N, and `--ckpt_path last` looks only in the new
    # run's own (empty) folder: the resumed run gets the file gpujob chose. A .ckpt is
    # written in place (no rename): finished once it has not changed for 5 s.
    train: dict = {"checkpoint": {"path": path, "every": "15m", "settle": "5s"},
                   "resume_args": ["--ckpt_path", "{resume_from}"]}
    if rate and not any("ProgressBar" in a for a in argv):
        train["command"] = _append(command, [LIGHTNING_BAR])
    train.update(_standby(command, PRELOAD["lightning"]))
    # No --trainer.enable_checkpointing false: Lightning refuses it beside a configured
    # ModelCheckpoint (how a run saves every N steps); the warmup's own root dir keeps its saves apart.
    warm = _append(train.get("command", command), ["--trainer.max_steps", "3", "--trainer.default_root_dir",
                                                   "{workdir}/gpujob-warmup"])
    frag = {"train": train, "warmup": {"command": warm, "when": "cold", "timeout": "30m"}}
    # the bar's step counter over time, each step once, restored steps not counted
    # (Lightning's it/s is the run's average: smoothing=0; agent/judge/steprate.StepRate)
    return dict(frag, throughput={"format": "tqdm_steps"}) if rate else frag


RECIPES: dict[str, Recipe] = {r.name: r for r in (
    Recipe("specforge", "specforge", 2, "specforge 0.2.0 (PyPI, Aug 2026)",
           "specforge 0.2.0, offline DFlash, 1 process, on one H200 through gpujob, 2026-12-02 (torch 2.11.0+cu130; BENCHMARKS.md)",
           "`specforge train -c RUN.yaml` / `python -m specforge.cli train`: samples/s from the per-rank "
           "`step N: {...}` line (the first rank's) x tokens per sample, {run_id}-stepN/ checkpoints finished "
           "by training_state.pt, training.resume_from={resume_from}", _specforge, versions=("0.2.0",)),
    Recipe("hf_trainer", "transformers", 2, "transformers 5.8.1 and 5.17 (Trainer)",
           "transformers 5.17.0, a run_clm-style script, on one H200 through gpujob, 2026-12-02 (torch 2.11.0+cu130; BENCHMARKS.md)",
           "transformers.Trainer scripts: the tqdm bar's it/s x tokens per step (read from "
           "--per_device_train_batch_size, --max_seq_length, --gradient_accumulation_steps, "
           "--nproc_per_node), an eval's {'eval_loss': ...} line pauses judging, checkpoint-N/ directories "
           "finished by trainer_state.json, --resume_from_checkpoint {resume_from}", _hf,
           versions=("5.8.1", "5.17")),
    Recipe("nanogpt", "nanoGPT", 2, "nanoGPT train.py (karpathy/nanoGPT master, 2024)",
           "a trainer of ours with nanoGPT's flags, lines and out/ckpt.pt, on one H200 through gpujob, 2026-12-02 (torch 2.11.0+cu130; BENCHMARKS.md)",
           "nanoGPT's train.py: tokens per iteration (from --gradient_accumulation_steps, --batch_size, "
           "--block_size) / `iter N: ... time Y ms`, its eval line pauses judging, one out/ckpt.pt "
           "(settled 5 s), --init_from=resume", _nanogpt),
    Recipe("torchtitan", "torchtitan", 3, "torchtitan 0.2.2 (TOML config) and 0.3.0 (--module/--config)",
           "torchtitan 0.2.2 through torchrun, 1 process, on one H200 through gpujob, 2026-12-02 (torch "
           "2.11.0+cu130; BENCHMARKS.md); 0.3.0 not run: it needs torch.distributed.set_timeout, newer than 2.13",
           "torchtitan via torchrun: `tps: N` (the first rank's), DCP step-N/ checkpoints finished by "
           ".metadata (saving on), resumed from the newest by itself", _torchtitan, versions=("0.2", "0.3")),
    Recipe("lightning", "lightning", 4, "lightning 2.5 and 2.6.6 (LightningCLI)",
           "lightning 2.6.6, a LightningCLI script, on one H200 through gpujob, 2026-12-02 (torch 2.11.0+cu130; BENCHMARKS.md)",
           "LightningCLI scripts: the TQDM progress bar's step counter over time x tokens_per_step (its it/s is "
           "the run's average; the bar added: Lightning's "
           "rich bar prints nothing into a pipe), version_N/checkpoints/*.ckpt (settled 5 s), "
           "--ckpt_path {resume_from}", _lightning, versions=("2.5", "2.6")),
)}


def merge(base: dict, over: dict) -> dict:
    """``over`` on top of ``base``: mappings merge key by key, anything else is replaced."""
    out = copy.deepcopy(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def leaves(data: dict, prefix: tuple = ()) -> dict:
    """{dotted key: value} of a nested mapping's leaves (lists are leaves)."""
    out = {}
    for key, value in data.items():
        if isinstance(value, dict) and value:
            out.update(leaves(value, prefix + (str(key),)))
        else:
            out[".".join(str(p) for p in prefix + (key,))] = value
    return out


def apply(data: dict) -> tuple[dict, dict]:
    """(the spec's data with its recipe's keys under it, {dotted key: value} that came
    from the recipe). No ``recipe`` key: the data unchanged. RecipeError for a spec
    that the recipe cannot complete; KeyError is never raised (the name is checked)."""
    name = data.get("recipe")
    if name is None:
        return data, {}
    recipe = RECIPES[name]
    train, tput = data.get("train"), data.get("throughput", {})
    if not (isinstance(train, dict) and isinstance(train.get("command"), (str, list))
            and all(isinstance(a, str) for a in (train["command"] if isinstance(train["command"], list) else []))
            and isinstance(tput, (dict, type(None)))):
        return data, {}  # a malformed train or throughput: validation says what is wrong, in one line
    spec_own = {k: True for k in leaves(data)}
    frag = _yield_tied(recipe.derive(data), train)
    # The recipe's train.command (the log interval appended) only when the spec's own
    # command is what it was derived from; every other recipe key yields to the spec.
    merged = merge(frag, data)
    if "command" in frag.get("train", {}):
        merged["train"]["command"] = frag["train"]["command"]
    def owned(key: str) -> bool:  # the spec set it, or a mapping above it (`warmup: null`)
        parts = key.split(".")
        return any(".".join(parts[:n]) in spec_own for n in range(1, len(parts) + 1))
    came = {k: v for k, v in leaves(frag).items() if not owned(k) or k == "train.command"}
    return merged, came


def _yield_tied(frag: dict, train: dict) -> dict:
    """Keys of a recipe that only hold with another of its keys yield with it: its
    "finished" rule (done_file, settle) belongs to its checkpoint path, and resume_args
    with {resume_from} need a checkpoint (a spec's ``checkpoint: null`` drops them)."""
    ft = frag.get("train") or {}
    ck = train.get("checkpoint", {})
    if isinstance(ck, dict) and "path" in ck and isinstance(ft.get("checkpoint"), dict):
        ft["checkpoint"] = {k: v for k, v in ft["checkpoint"].items() if k not in ("done_file", "settle")}
    if ck is None and any("{resume_from}" in a for a in ft.get("resume_args") or []):
        del ft["resume_args"]
    return frag


def describe(name: str, sample_command=None) -> dict:
    """What a recipe sets, for `gpujob recipes`: its info and the keys of its fragment
    for a sample command (tokens per step given only where the recipe requires it)."""
    recipe = RECIPES[name]
    sample: dict[str, dict[str, Any]] = {"train": {"command": sample_command or SAMPLE_COMMANDS[name]}}
    try:
        frag = recipe.derive(sample)
    except RecipeError:
        sample["throughput"] = {"tokens_per_step": 4096}
        frag = recipe.derive(sample)
    return {**recipe.info(), "summary": recipe.summary, "sample_command": sample["train"]["command"],
            "sets": leaves(frag), **({"given": leaves({"throughput": sample["throughput"]})}
                                     if "throughput" in sample else {})}


SAMPLE_COMMANDS = {
    "specforge": "python -m specforge.cli train -c run.yaml output_dir={workdir}/outputs run_id=dflash",
    "hf_trainer": "python train.py --output_dir out --per_device_train_batch_size 8 --max_seq_length 1024",
    "nanogpt": "python train.py --batch_size=12 --block_size=1024",
    "torchtitan": "torchrun --nproc_per_node 8 -m torchtitan.train --job.config_file train.toml",
    "lightning": "python main.py fit --config config.yaml",
}
