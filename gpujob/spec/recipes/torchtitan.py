"""The recipe for torchtitan through torchrun (0.2's TOML config, 0.3's --module/--config)."""

from __future__ import annotations

from gpujob.spec.recipes.base import Recipe, append, argv_of, flag, own_rate


def derive(data: dict) -> dict:
    """The spec's data -> the recipe's fragment (RecipeError for a spec it cannot complete)."""
    command = (data.get("train") or {}).get("command")
    argv = argv_of(command)
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
        train["command"] = append(command, add)
    # saving off in the warmup: with it on, a second warmup in the same folder loads the
    # first one's step-3 and trains no step (and a big model's last-step save is slow)
    warm = append(train.get("command", command), ["--training.steps", "3", dump, "{workdir}/gpujob-warmup",
                                                  "--checkpoint.no-enable"])
    frag = {"train": train, "warmup": {"command": warm, "when": "cold", "timeout": "30m"}}
    # every rank prints its own tps (tokens/s per device): the first rank's line is the
    # sample, so min and a given baseline are per device (scope per_gpu scales it by the GPUs)
    return frag if own_rate(data, "torchtitan") else dict(frag, throughput={"format": "torchtitan",
                                                                             "ranks": "first"})


RECIPE = Recipe(name="torchtitan", trainer="torchtitan", revision=3,
                read_from="torchtitan 0.2.2 (TOML config) and 0.3.0 (--module/--config)",
                proven_on="torchtitan 0.2.2 through torchrun, 1 process, on one H200 through gpujob, "
                          "2026-12-02 (torch 2.11.0+cu130; BENCHMARKS.md); 0.3.0 not run: it needs "
                          "torch.distributed.set_timeout, newer than 2.13",
                summary="torchtitan via torchrun: `tps: N` (the first rank's), DCP step-N/ checkpoints "
                        "finished by .metadata (saving on), resumed from the newest by itself",
                derive=derive, versions=("0.2", "0.3"),
                sample_command="torchrun --nproc_per_node 8 -m torchtitan.train --job.config_file "
                               "train.toml")
