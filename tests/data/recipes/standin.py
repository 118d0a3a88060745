"""A stand-in for five trainers (tests/test_recipes_local.py): STYLE is the first
argument; it prints that trainer's progress lines, keeps its checkpoints where and
how that trainer keeps them, and resumes the way it does. SLOW=1 in the
environment makes it slow (the profile a rollback leaves). Its rate: about 20
steps/s fast, 2 slow."""

import glob
import os
import re
import sys
import time

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
                default="60"))
slow = os.environ.get("SLOW") == "1"
interval = 0.5 if slow else 0.05
start = 0

if style == "specforge":
    out, run_id = opt("output_dir", default="output"), opt("run_id", default="specforge-run")
    resume = opt("training.resume_from")
    save_every = int(opt("training.save_interval", default="5"))
    log_every = int(opt("training.log_interval", default="50"))
    if resume:
        latest = os.path.join(resume, f"{run_id}-latest")
        start = int(re.search(r"step(\d+)$", os.path.realpath(latest)).group(1))
        print(f"resumed from checkpoint at step {start}", flush=True)

    def tick(step, dt):
        if step % log_every == 0:
            for rank in range(2):  # every rank prints it
                print(f"[rank{rank}]: step {step}: {{'loss': 1.5, 'perf/global_samples_per_second': "
                      f"{1.0 / dt:.3f}}}", flush=True)
        if save_every and step % save_every == 0:
            d = os.path.join(out, f"{run_id}-step{step}")
            os.makedirs(d, exist_ok=True)
            with open(os.path.join(d, "training_state.pt"), "w") as f:
                f.write(str(step))
            link = os.path.join(out, f"{run_id}-latest")
            if os.path.lexists(link):
                os.unlink(link)
            os.symlink(os.path.basename(d), link)
elif style == "hf":
    out = opt("--output_dir", default="output")
    if opt("--save_strategy") != "no":
        done = sorted(glob.glob(os.path.join(out, "checkpoint-*", "trainer_state.json")),
                      key=lambda p: int(p.split("checkpoint-")[1].split("/")[0]))
        if done:  # HF's example scripts: the newest finished checkpoint-N of --output_dir
            start = int(done[-1].split("checkpoint-")[1].split("/")[0])
            print(f"resumed from checkpoint at step {start}", flush=True)

    def tick(step, dt):
        sys.stdout.write(f"\r{100 * step // steps:3d}%|####| {step}/{steps} [00:01<00:01, {1.0 / dt:.2f}it/s]")
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

    def tick(step, dt):
        if step % log_every == 0:
            print(f"iter {step}: loss 2.0000, time {dt * 1000:.2f}ms, mfu 12.00%", flush=True)
        if step % 10 == 2 and opt("--always_save_checkpoint") != "False":  # at its eval interval
            os.makedirs(out, exist_ok=True)
            with open(os.path.join(out, "ckpt.pt"), "w") as f:
                f.write(str(step))
elif style == "torchtitan":
    folder = os.path.join(opt("--job.dump_folder", default="outputs"), opt("--checkpoint.folder",
                                                                           default="checkpoint"))
    log_every = int(opt("--metrics.log_freq", default="10"))
    enabled = "--checkpoint.enable" in args
    done = sorted(glob.glob(os.path.join(folder, "step-*", ".metadata")),
                  key=lambda p: int(p.split("step-")[1].split("/")[0]))
    if enabled and done:  # torchtitan loads the newest step-N by itself
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
    root = opt("--trainer.default_root_dir", default="lightning_logs")
    ck = os.path.join(root, "version_0", "checkpoints")
    if opt("--ckpt_path") == "last":
        with open(os.path.join(ck, "last.ckpt")) as f:
            start = int(f.read())
        print(f"resumed from checkpoint at step {start}", flush=True)

    def tick(step, dt):
        sys.stdout.write(f"\rEpoch 0:  {100 * step // steps}%|####| {step}/{steps} [00:01<00:01, {1.0 / dt:.2f}it/s, "
                         "v_num=0]")
        sys.stdout.flush()
        if opt("--trainer.enable_checkpointing") != "false" and step % 10 == 2:  # every_n_train_steps
            os.makedirs(ck, exist_ok=True)
            with open(os.path.join(ck, "last.ckpt"), "w") as f:
                f.write(str(step))
else:
    sys.exit(f"unknown style {style}")

for step in range(start + 1, steps + 1):
    time.sleep(interval)
    tick(step, interval)
print(f"\ndone at step {steps}", flush=True)
