"""A stand-in for five trainers (tests/test_recipes_local.py): STYLE is the first
argument; it prints that trainer's progress lines, keeps its checkpoints where and
how that trainer keeps them, and resumes the way it does. SLOW=1 in the
environment makes it slow (the profile a rollback leaves). Its rate: about 20
steps/s fast, 2 slow; STANDIN_INTERVAL (a step's seconds) sets it instead."""

import glob
import os
import re
import sys
import time

if "STANDIN_INTERVAL" not in os.environ:  # (the journeys' venvs hold only the kernels' wheel)
    import pydantic  # noqa: F401 - stands for the trainer's heavy imports (torch): what a standby preloads

style, args = sys.argv[1], sys.argv[2:]


def opt(*names, default=None):
    found = default
    for i, a in enumerate(args):
        for n in names:
            if a == n and i + 1 < len(args):
                found = args[i + 1]
            elif a.startswith(n + "="):
                found = a[len(n) + 1:]
    return found


steps = int(opt("training.max_steps", "--max_steps", "--max_iters", "--training.steps", "--trainer.max_steps",
                default=os.environ.get("STANDIN_STEPS", "60")))
slow = os.environ.get("SLOW") == "1"
# STANDIN_INTERVAL: a step's seconds, set by the journeys' launchers (tests/data/journeys) from
# the kernels' wheel build in the venv, as a torch build sets a real trainer's
interval = float(os.environ.get("STANDIN_INTERVAL") or (0.5 if slow else 0.05))
start = 0

if style == "specforge":
    out, run_id = opt("output_dir", default="output"), opt("run_id", default="specforge-run")
    resume = opt("training.resume_from")
    save_every = int(opt("training.save_interval", default="5"))
    log_every = int(opt("training.log_interval", default="50"))
    if resume:  # a checkpoint directory, its training_state.pt, or a run root (its {run_id}-latest)
        resume = os.path.dirname(resume) if resume.endswith("training_state.pt") else resume
        found = resume if os.path.isfile(os.path.join(resume, "training_state.pt")) else \
            os.path.join(resume, f"{run_id}-latest")
        start = int(re.search(r"step(\d+)$", os.path.realpath(found)).group(1))
        print(f"resumed from checkpoint at step {start}", flush=True)

    def tick(step, dt):
        if step % log_every == 0:
            for rank in range(2):  # every rank prints it
                print(f"[rank{rank}]: step {step}: {{'loss': 1.5, 'perf/global_samples_per_second': "
                      f"{1.0 / dt:.3f}}}", flush=True)
        if save_every and step % save_every == 0:
            d = os.path.join(out, f"{run_id}-step{step}")
            os.makedirs(d, exist_ok=True)
            for name in ("training_state_rank0.pt", "training_state.pt"):  # rank files, then the shared one
                with open(os.path.join(d, name + ".tmp"), "w") as f:
                    f.write(str(step))
                os.replace(os.path.join(d, name + ".tmp"), os.path.join(d, name))
            link = os.path.join(out, f"{run_id}-latest")
            if os.path.lexists(link):
                os.unlink(link)
            os.symlink(os.path.basename(d), link)
elif style == "hf":
    out = opt("--output_dir", default="output")
    given = opt("--resume_from_checkpoint")
    eval_steps = int(opt("--eval_steps", default="0"))  # eval_strategy steps (HF's default: no evaluation)
    if given:  # trainer.train(resume_from_checkpoint=...): that directory's trainer_state.json
        with open(os.path.join(given, "trainer_state.json")) as f:
            start = int(re.search(r'"global_step": (\d+)', f.read()).group(1))
        print(f"resumed from checkpoint at step {start}", flush=True)
    elif opt("--save_strategy") != "no":
        done = sorted(glob.glob(os.path.join(out, "checkpoint-*", "trainer_state.json")),
                      key=lambda p: int(p.split("checkpoint-")[1].split("/")[0]))
        if done:  # HF's example scripts: the newest finished checkpoint-N of --output_dir
            start = int(done[-1].split("checkpoint-")[1].split("/")[0])
            print(f"resumed from checkpoint at step {start}", flush=True)

    def tick(step, dt):
        sys.stdout.write(f"\r{100 * step // steps:3d}%|####| {step}/{steps} "
                         f"[00:01<00:01, {1.0 / dt:.2f}it/s]")
        sys.stdout.flush()
        # the eval bar, then tqdm.write of the metrics (bar cleared)
        if eval_steps and step % eval_steps == 0:
            sys.stdout.write(f"\r 50%|##  | 1/2 [00:00<00:00, {40.0 / dt:.2f}it/s]\r{' ' * 20}\r"
                             "{'eval_loss': 1.25, 'eval_runtime': 0.1, 'epoch': 0.5}\n")
            sys.stdout.flush()
        if opt("--save_strategy") != "no" and step % 2 == 0:
            d = os.path.join(out, f"checkpoint-{step}")
            os.makedirs(d, exist_ok=True)
            open(os.path.join(d, "model.safetensors"), "w").write("w")
            open(os.path.join(d, "trainer_state.json"), "w").write('{"global_step": %d}' % step)
elif style == "nanogpt":
    out = opt("--out_dir", default="out")
    log_every = int(opt("--log_interval", default="10"))
    if opt("--init_from") == "resume":
        with open(os.path.join(out, "ckpt.pt")) as f:
            start = int(f.read())
        print(f"resumed from checkpoint at step {start}", flush=True)

    eval_every = int(opt("--eval_interval", default="10"))
    state = {"extra": 0.0}

    def tick(step, dt):
        if step % log_every == 0:  # dt is the whole iteration: an eval and save before it included
            print(f"iter {step}: loss 2.0000, time {(dt + state['extra']) * 1000:.2f}ms, mfu 12.00%",
                  flush=True)
        state["extra"] = 0.0
        if step % eval_every == 2:  # at its eval interval: the losses, then ckpt.pt rewritten in place
            print(f"step {step}: train loss 2.0000, val loss 2.1000", flush=True)
            if opt("--always_save_checkpoint") != "False":
                print(f"saving checkpoint to {out}", flush=True)
                os.makedirs(out, exist_ok=True)
                with open(os.path.join(out, "ckpt.pt"), "w") as f:
                    f.write(str(step))
            time.sleep(dt)
            state["extra"] = dt
elif style == "torchtitan":
    folder = os.path.join(opt("--job.dump_folder", default="outputs"), opt("--checkpoint.folder",
                                                                           default="checkpoint"))
    log_every = int(opt("--metrics.log_freq", default="10"))
    # a bool flag of tyro's: the last of --checkpoint.enable / --checkpoint.no-enable wins
    toggles = [a for a in args if a in ("--checkpoint.enable", "--checkpoint.no-enable")]
    enabled = bool(toggles) and toggles[-1] == "--checkpoint.enable"
    done = sorted(glob.glob(os.path.join(folder, "step-*", ".metadata")),
                  key=lambda p: int(p.split("step-")[1].split("/")[0]))
    initial = opt("--checkpoint.initial_load_path", "--checkpoint.initial-load-path")
    # tyro's bool flag (either spelling): the last of initial_load_model_only / no_initial_... wins
    toggles = [a.replace("-", "_") for a in args if a.replace("-", "_").endswith("initial_load_model_only")]
    model_only = not toggles or not toggles[-1].endswith("no_initial_load_model_only")
    if enabled and not os.path.exists(folder) and initial:  # torchtitan: only while its folder is not there
        if not os.path.isdir(initial):
            sys.exit("ValueError: checkpoint.initial_load_path is specified but the path is not valid.")
        print(f"Loading the checkpoint from {initial}.", flush=True)
        if not model_only:  # the whole state: the step too
            start = int(os.path.basename(initial.rstrip("/")).split("step-")[1])
            print(f"resumed from checkpoint at step {start}", flush=True)
    elif enabled and done:  # torchtitan loads the newest step-N of its own folder by itself
        if initial:
            print("checkpoint.initial_load_path is provided but the checkpoint.folder exists.", flush=True)
        start = int(done[-1].split("step-")[1].split("/")[0])
        print(f"resumed from checkpoint at step {start}", flush=True)

    def tick(step, dt):
        if step % log_every == 0:
            print(f"[rank0]:[titan] step: {step}  loss:  2.0  memory: 1.0GiB(1%)  tps: {512 / dt:,.0f}  "
                  f"tflops: 1.0  mfu: 1.0%", flush=True)
        if enabled and step % 2 == 0:
            d = os.path.join(folder, f"step-{step}")
            os.makedirs(d, exist_ok=True)
            open(os.path.join(d, "__0_0.distcp"), "w").write("w")
            open(os.path.join(d, ".metadata"), "w").write("m")
elif style == "lightning":
    # as Lightning 2.6: a ModelCheckpoint is what the run's own arguments configure
    # (--trainer.callbacks+=ModelCheckpoint --trainer.callbacks.every_n_train_steps=N), and
    # enable_checkpointing false beside one is refused; the bar is the TQDM one only when
    # asked for (with rich installed Lightning picks its rich bar, which draws nothing into a
    # pipe until the run ends)
    logs = os.path.join(opt("--trainer.default_root_dir", default="."), "lightning_logs")
    version = len(glob.glob(os.path.join(logs, "version_*")))  # the logger's next version
    ck = os.path.join(logs, f"version_{version}", "checkpoints")
    callbacks = [a.split("+=", 1)[1] for a in args if a.startswith("--trainer.callbacks+=")]
    every = int(opt("--trainer.callbacks.every_n_train_steps", default="0"))
    if opt("--trainer.enable_checkpointing") == "false" and "ModelCheckpoint" in callbacks:
        sys.exit("lightning.fabric.utilities.exceptions.MisconfigurationException: Trainer was configured "
                 "with `enable_checkpointing=False` but found `ModelCheckpoint` in callbacks list.")
    enabled = "ModelCheckpoint" in callbacks and every > 0
    tqdm_bar = "TQDMProgressBar" in callbacks
    if enabled:
        os.makedirs(ck, exist_ok=True)
    path = opt("--ckpt_path")
    if path == "last":  # ModelCheckpoint looks in its own dirpath: this run's new version_N/checkpoints
        path = None
        print('.fit(ckpt_path="last") is set, but there is no last checkpoint available. No checkpoint will '
              "be loaded.", flush=True)
    if path:
        with open(path) as f:
            start = int(f.read())
        print(f"Restoring states from the checkpoint path at {path}", flush=True)
        print(f"resumed from checkpoint at step {start}", flush=True)
    saved = []
    tear_at = int(os.environ.get("STANDIN_TEAR_AT") or 0)  # tests/local/test_settle_death.py's
    pause_at = int(os.environ.get("STANDIN_PAUSE_AT") or 0)

    def tick(step, dt):
        if tqdm_bar:
            sys.stdout.write(f"\rEpoch 0:  {100 * step // steps}%|####| {step}/{steps} [00:01<00:01, "
                             f"{1.0 / dt:.2f}it/s, v_num={version}]")
            sys.stdout.flush()
        elif step == steps:  # the rich bar: one drawing when the run ends
            print(f"Epoch 0/-2 ━━━━━━━━━━ {step}/{steps} 0:00:01 • 0:00:00 {1.0 / dt:.2f}it/s v_num: "
                  f"{version}", flush=True)
        if enabled and step % every == 2 % every:  # written in place, the previous one removed
            name = os.path.join(ck, f"epoch=0-step={step}.ckpt")
            with open(name, "w") as f:
                if tear_at and step >= tear_at:  # killed mid-save: half a checkpoint at its name
                    f.write("torn")
                    f.flush()
                    os.kill(os.getpid(), 9)
                if step == pause_at:  # a slow save: half of it, a pause, then the whole
                    f.write("torn")
                    f.flush()
                    time.sleep(float(os.environ.get("STANDIN_SAVE_PAUSE") or 0))
                    f.seek(0)
                    f.truncate()
                f.write(str(step))
            for old in saved:
                os.unlink(old)
            saved[:] = [name]
else:
    sys.exit(f"unknown style {style}")

for step in range(start + 1, steps + 1):
    time.sleep(interval)
    tick(step, interval)
print(f"\ndone at step {steps}", flush=True)
