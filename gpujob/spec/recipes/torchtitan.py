"""The recipe for torchtitan through torchrun (0.2's TOML config, 0.3's --module/--config)."""

from __future__ import annotations

from gpujob.spec.recipes.base import Recipe, append, argv_of, flag, own_rate


#: torchtitan options that change when and where a run saves, logs and stops, nothing compiled:
#: a change of them alone keeps the warmup's cache warm (warmup.ignore_flags)
UNCOMPILED = ["--training.steps", "--checkpoint.interval", "--checkpoint.folder",
              "--checkpoint.keep_latest_k",
              "--checkpoint.enable", "--checkpoint.no-enable", "--checkpoint.no_enable",
              "--checkpoint.load_step",
              "--metrics.log_freq", "--metrics.enable_tensorboard", "--metrics.enable_wandb",
              "--job.dump_folder", "--job.description"]


def derive(data: dict) -> dict:
    """The spec's data -> the recipe's fragment (RecipeError for a spec it cannot complete)."""
    command = (data.get("train") or {}).get("command")
    argv = argv_of(command)
    # 0.2 (--job.config_file X.toml) names its dump folder --job.dump_folder; 0.3 (--module M
    # --config F, a Python config registry) --dump_folder, and refuses the other
    dump = "--dump_folder" if flag(argv, "--job.config_file") is None and (
        flag(argv, "--module", "--dump_folder") is not None) else "--job.dump_folder"
    folder = flag(argv, dump) or "outputs"
    given, rel = flag(argv, "--checkpoint.folder"), folder.replace("{workdir}/", "").rstrip("/")
    # torchtitan loads the newest step-N of its folder by itself, at a fresh start too: a folder
    # per job (checkpoint/{job_id}), so it never finds an earlier job's. DCP's step-N/ is
    # finished by .metadata, its last file
    ck = given or "checkpoint/{job_id}"
    train: dict = {"checkpoint": {"path": f"{rel}/{ck}/step-*", "done_file": ".metadata", "every": "15m"},
                   "resume_args": []}
    # it saves only with checkpoint.enable (off by default); saving off in the command: a resume turns it on
    off = {"--checkpoint.no-enable", "--checkpoint.no_enable"} & set(argv)
    add = [] if off or "--checkpoint.enable" in argv else ["--checkpoint.enable"]
    train["resume_args"] = ["--checkpoint.enable"] if off else []
    add += [] if given is not None else ["--checkpoint.folder", ck]
    add += [] if flag(argv, "--metrics.log_freq") is not None else ["--metrics.log_freq", "1"]
    if add:
        train["command"] = append(command, add)
    # saving off in the warmup: with it on, a second warmup in the same folder loads the
    # first one's step-3 and trains no step (and a big model's last-step save is slow)
    warm = append(train.get("command", command), ["--training.steps", "3", dump, "{workdir}/gpujob-warmup",
                                                  "--checkpoint.no-enable"])
    frag = {"train": train,
            "warmup": {"command": warm, "when": "cold", "timeout": "30m", "ignore_flags": UNCOMPILED}}
    # every rank prints its own tps (tokens/s per device): the first rank's line is the
    # sample, so min and a given baseline are per device (scope per_gpu scales it by the GPUs)
    return frag if own_rate(data, "torchtitan") else dict(frag, throughput={"format": "torchtitan",
                                                                             "ranks": "first"})


RECIPE = Recipe(name="torchtitan", trainer="torchtitan", revision=5,
                read_from="torchtitan 0.2.2 (TOML config) and 0.3.0 (--module/--config)",
                proven_on="torchtitan 0.2.2 through torchrun, 1 process, on one H200 through gpujob, "
                          "2026-12-02 (torch 2.11.0+cu130; BENCHMARKS.md); 0.3.0 not run: it needs "
                          "torch.distributed.set_timeout, newer than 2.13",
                summary="torchtitan via torchrun: `tps: N` (the first rank's), DCP step-N/ checkpoints "
                        "finished by .metadata (saving on) in a checkpoint folder of each job's own (it "
                        "loads the newest there by itself: never an earlier job's)",
                derive=derive, versions=("0.2", "0.3"),
                sample_command="torchrun --nproc_per_node 8 -m torchtitan.train --job.config_file "
                               "train.toml")
