"""The recipe for nanoGPT's train.py (its flags, its lines, one ckpt.pt in an out_dir of each job's own)."""

from __future__ import annotations

import shlex

from gpujob.spec.recipes.base import (COMPILE, SAFE, Recipe, RecipeError, append, argv_of,
                                      as_int, flag, own_rate, standby)

#: what a fresh interpreter of the trainer imports before its first step (the standby)
PRELOAD = COMPILE + ["numpy", "torch.distributed", "torch.nn.parallel"]


NANOGPT_PATTERN = r"^iter (?P<step>\d+): loss [0-9.]+, time (?P<ms>[0-9.]+)ms"
NANOGPT_EVAL_PATTERN = r"^step \d+: train loss"  # its eval (then a save): the next iter's time holds both


def nanogpt_tokens(argv: list) -> int | None:
    """nanoGPT's tokens per iteration: gradient_accumulation_steps x batch_size x
    block_size over all processes (it divides gradient_accumulation_steps by the world
    size, so the product is the same for any number). Its defaults are 40, 12, 1024;
    None when a config file is given (``train.py config/x.py``: its values are not read)
    and the command does not give all three."""
    keys = ("--gradient_accumulation_steps", "--batch_size", "--block_size")
    given = [as_int(flag(argv, k)) for k in keys]
    script = next((i for i, a in enumerate(argv) if a.endswith(".py")), None)
    config = script is not None and any(a.endswith(".py") and not a.startswith("-")
                                        for a in argv[script + 1:])
    if config and not all(given):
        return None
    ga, bs, block = (v or d for v, d in zip(given, (40, 12, 1024)))
    return ga * bs * block


#: nanoGPT's config keys that change when and where a run evaluates, logs, saves and stops,
#: nothing compiled: a change of them alone keeps the warmup's cache warm (warmup.ignore_flags)
UNCOMPILED = ["--eval_interval", "--log_interval", "--max_iters", "--out_dir", "--always_save_checkpoint",
              "--wandb_log", "--wandb_project", "--wandb_run_name", "--init_from", "--eval_iters", "--seed"]


def per_job_dir(data: dict, argv: list) -> tuple:
    """(the out_dir the trainer writes ckpt.pt into, whether the command gets it appended).
    nanoGPT's --init_from=resume loads OUT/ckpt.pt and every save rewrites that one file:
    jobs of one out_dir share it, so a resume (a rollback's, or submit --resume-from JOB)
    would take whichever job saved last. So the command gets --out_dir=OUT/{job_id}
    appended (its configurator: the last one wins): each job saves into, and resumes from,
    its own. Left alone: an out_dir with {job_id} in it already, and a spec whose own
    train.checkpoint (a path, or null) says where checkpoints go."""
    given = flag(argv, "--out_dir") or "out"
    ck = (data.get("train") or {}).get("checkpoint", {})
    if "{job_id}" in given or not (isinstance(ck, dict) and "path" not in ck):
        return given, False
    return given.rstrip("/") + "/{job_id}", True


def append_dir(command, out: str):
    """The command with ``--out_dir=OUT/{job_id}`` appended; an out_dir of other characters
    than safe ones is quoted up to the placeholder, which stays bare for gpujob to fill in."""
    head = "--out_dir=" + out[:-len("{job_id}")]
    if isinstance(command, list) or SAFE.fullmatch(head):
        return append(command, [head + "{job_id}"])
    return f"{command} {shlex.quote(head)}{{job_id}}"


def derive(data: dict) -> dict:
    """The spec's data -> the recipe's fragment (RecipeError for a spec it cannot complete)."""
    command = (data.get("train") or {}).get("command")
    argv = argv_of(command)
    out, rewrite = per_job_dir(data, argv)
    out_dir = out.replace("{workdir}/", "").rstrip("/")
    # one OUT/{job_id}/ckpt.pt, rewritten in place by torch.save (no rename): finished once it
    # has not changed for 5 s. --init_from=resume loads it from there (no path to pass): submit
    # --resume-from's checkpoint is copied there first (agent/supervisor/cksupervise.py start_copy)
    train: dict = {"checkpoint": {"path": f"{out_dir}/ckpt.pt", "every": "15m", "settle": "5s"},
                   "resume_args": ["--init_from=resume"]}
    train.update(standby(command, PRELOAD))
    if flag(argv, "--log_interval") is None:
        train["command"] = append(command, ["--log_interval=1"])
    warm = append(train.get("command", command), ["--max_iters=3", "--eval_interval=1000000",
                                                  "--always_save_checkpoint=False",
                                                  "--out_dir={workdir}/gpujob-warmup"])
    frag = {"train": train,
            "warmup": {"command": warm, "when": "cold", "timeout": "30m", "ignore_flags": UNCOMPILED},
            "throughput": {"pause_pattern": NANOGPT_EVAL_PATTERN}}
    if rewrite:  # after the warmup's command was made: it keeps its own out_dir (and its warm key)
        train["command"] = append_dir(train.get("command", command), out)
    if own_rate(data, "regex"):
        return frag
    tput: dict = {"format": "regex", "pattern": NANOGPT_PATTERN, "pause_pattern": NANOGPT_EVAL_PATTERN}
    if "tokens_per_step" not in (data.get("throughput") or {}):
        tokens = nanogpt_tokens(argv)
        if tokens is None:
            raise RecipeError("throughput.tokens_per_step", "missing (required) for recipe nanogpt: a config "
                              "file is given and the command does not give all of "
                              "--gradient_accumulation_steps, --batch_size and --block_size "
                              "(its tokens per iteration)")
        tput["tokens_per_step"] = tokens
    return dict(frag, throughput=tput)


RECIPE = Recipe(name="nanogpt", trainer="nanoGPT", revision=4,
                read_from="nanoGPT train.py (karpathy/nanoGPT master, 2024)",
                proven_on="a trainer of ours with nanoGPT's flags, lines and out/ckpt.pt, on one H200 "
                          "through gpujob, 2026-12-02 (torch 2.11.0+cu130; BENCHMARKS.md)",
                summary="nanoGPT's train.py: tokens per iteration (from --gradient_accumulation_steps, "
                        "--batch_size, --block_size) / `iter N: ... time Y ms`, its eval line pauses "
                        "judging, one ckpt.pt (settled 5 s) in an out_dir of each job's own "
                        "(OUT/{job_id}: --init_from=resume loads OUT/ckpt.pt, so never an earlier "
                        "job's; submit --resume-from's is copied there), --init_from=resume",
                derive=derive,
                preload=tuple(PRELOAD),
                sample_command="python train.py --batch_size=12 --block_size=1024")
