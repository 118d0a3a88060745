"""Write the recording plan (JSON) for record_traces.py.

  python3 plan.py --root DIR --work /tmp/rec -o plan.json          # the H200 run
  python3 plan.py --root DIR --work /tmp/rec -o plan.json --cpu    # a tiny CPU rehearsal

DIR holds hf_trainer.py, nanogpt_trainer.py, compile_race.py and dflash_mini/trainer.py.
Five lanes run side by side on the one GPU: hf, hf_broken, nanogpt, dflash, race.
"""

from __future__ import annotations

import argparse
import json
import os


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--root", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("-o", "--out", required=True)
    ap.add_argument("--python", default="python3")
    ap.add_argument("--cpu", action="store_true")
    ap.add_argument("--scale", type=float, default=1.0, help="multiplies every training time")
    ap.add_argument("--layout", choices=["five", "pairs", "race"], default="five",
                    help="five: 5 lanes at once (every trainer, the race); pairs: 2 lanes, no race, "
                         "the HF resume is a rollback (the compiled profile resumes the broken run's "
                         "checkpoint); race: the compile race alone, restarts on one cache and more warm "
                         "tries")
    a = ap.parse_args()
    root, work, py = os.path.abspath(a.root), os.path.abspath(a.work), a.python
    T = lambda s: max(4.0, round(s * a.scale, 1))  # noqa: E731
    broken = {"TORCHDYNAMO_DISABLE": "1"}

    def cache(name):
        return {"TORCHINDUCTOR_CACHE_DIR": f"{work}/caches/{name}/inductor",
                "TRITON_CACHE_DIR": f"{work}/caches/{name}/triton"}

    # --- a) HF transformers.Trainer -------------------------------------------------
    hf = [py, f"{root}/hf_trainer.py", "--out", "hf_out", "--compile"]
    hf_size = ["--hidden", "64", "--layers", "2", "--heads", "2", "--seq", "128", "--batch", "4",
               "--vocab", "512", "--cpu", "--attn", "sdpa", "--logging-steps", "20"] if a.cpu else []
    hf_tps = (4 * 128) if a.cpu else (16 * 1024)
    hf_common = {"trainer": "hf_transformers_trainer", "tokens_per_step": hf_tps, "ckpt_dir": "hf_out"}
    hf_nocompile = {"cmd": [x for x in hf if x != "--compile"]}
    lane_hf = [
        dict(hf_common, name="hf_trainer_compiled", profile="compiled", cwd=f"{work}/hf",
             cmd=hf + hf_size + ["--time-limit", str(T(90)), "--save-every-s", str(T(15))],
             env=cache("hf"), timeout=T(100) + 150,
             notes="TrainingArguments(torch_compile=True); HF's own flex_attention wrapper compiles too",
             fallback=dict(name="hf_trainer_compiled_nomodelcompile",
                           cmd=hf_nocompile["cmd"] + hf_size + ["--time-limit", str(T(90)),
                                                                "--save-every-s", str(T(15))],
                           notes="fallback: torch_compile=True failed; only HF's flex_attention compile")),
        dict(hf_common, name="hf_trainer_compiled_resume", profile="compiled", resume=True,
             cwd=f"{work}/hf", env=cache("hf"), timeout=T(60) + 120,
             cmd=hf + hf_size + ["--time-limit", str(T(60)), "--save-every-s", str(T(15)), "--resume"],
             notes="resume_from_checkpoint=True after hf_trainer_compiled, same output dir, warm cache"),
    ]
    lane_hf_broken = [
        dict(hf_common, name="hf_trainer_broken_compile", profile="broken_compile", cwd=f"{work}/hf_broken",
             cmd=hf + hf_size + ["--time-limit", str(T(90)), "--save-every-s", str(T(15))],
             env=dict(cache("hf_broken"), **broken), timeout=T(100) + 100,
             notes="same command, TORCHDYNAMO_DISABLE=1: flex_attention falls back to eager"),
    ]
    # --- b) nanoGPT-style ----------------------------------------------------------
    ng = [py, f"{root}/nanogpt_trainer.py", "--compile=True"]
    ng_size = ["--device=cpu", "--dtype=float32", "--attn=sdpa", "--n_layer=2", "--n_embd=64", "--n_head=2",
               "--block_size=128", "--batch_size=4", "--vocab_size=512", "--log_interval=20"] if a.cpu else []
    ng_common = {"trainer": "nanogpt_style", "tokens_per_step": (4 * 128) if a.cpu else (16 * 1024),
                 "ckpt_dir": "out"}
    ev = f"--eval_interval_s={T(15)}"
    lane_ng = [
        dict(ng_common, name="nanogpt_compiled", profile="compiled", cwd=f"{work}/ng",
             cmd=ng + ng_size + [ev, f"--time_limit={T(90)}"], env=cache("ng"), timeout=T(90) + 150),
        dict(ng_common, name="nanogpt_compiled_resume", profile="compiled", resume=True, cwd=f"{work}/ng",
             cmd=ng + ng_size + [ev, f"--time_limit={T(45)}", "--init_from=resume"], env=cache("ng"),
             timeout=T(45) + 120, notes="--init_from=resume of out/ckpt.pt, warm cache"),
        dict(ng_common, name="nanogpt_broken_compile", profile="broken_compile", cwd=f"{work}/ng_broken",
             cmd=ng + ng_size + [ev, f"--time_limit={T(90)}"], env=dict(cache("ng_broken"), **broken),
             timeout=T(90) + 100),
    ]
    # --- c) jobs/dflash_mini -------------------------------------------------------------
    df = [py, f"{root}/dflash_mini/trainer.py", "--ckpt-dir", "ckpt", "--ckpt-every", str(T(10))]
    df_size = ["--device", "cpu", "--seq-len", "128", "--hidden", "64", "--heads", "2", "--vocab", "512",
               "--batch", "2"] if a.cpu else []
    df_common = {"trainer": "dflash_mini", "tokens_per_step": (2 * 128) if a.cpu else (8 * 1024),
                 "ckpt_dir": "ckpt"}
    lane_df = [
        dict(df_common, name="dflash_mini_compiled", profile="compiled", cwd=f"{work}/df",
             cmd=df + df_size + ["--time-limit", str(T(90))], env=dict(cache("df"), DFLASH_COMPILE="1"),
             timeout=T(90) + 120),
        dict(df_common, name="dflash_mini_compiled_resume", profile="compiled", resume=True, cwd=f"{work}/df",
             cmd=df + df_size + ["--time-limit", str(T(40)), "--resume"],
             env=dict(cache("df"), DFLASH_COMPILE="1"), timeout=T(40) + 90),
        dict(df_common, name="dflash_mini_broken_compile", profile="broken_compile", cwd=f"{work}/df_broken",
             cmd=df + df_size + ["--time-limit", str(T(90))],
             env=dict(cache("df_broken"), DFLASH_COMPILE="1", **broken), timeout=T(90) + 90,
             notes="DFLASH_COMPILE=1 (the fast profile's env) plus TORCHDYNAMO_DISABLE=1"),
    ]
    # --- e) the compile race ---------------------------------------------------------------
    rc = [py, f"{root}/compile_race.py"] + (["--device", "cpu", "--seq", "128", "--steps", "1"] if a.cpu
                                            else [])
    race_t = 25 if a.cpu else 60
    r_common = {"trainer": "compile_race", "phase": "warmup", "min_time": 20}
    lane_race = [dict(r_common, name="race_cold_3threads_1", profile="compiled", cwd=f"{work}/race",
                      cmd=rc + ["--threads", "3"], env=cache("race_cold1"), timeout=race_t,
                      notes="3 threads, cold (empty) inductor + triton cache; SIGABRT after the timeout")]
    lane_race.append(dict(r_common, name="race_warmup_1thread", profile="compiled", cwd=f"{work}/race",
                          cmd=rc + ["--threads", "1"], env=cache("race_warm"), timeout=race_t * 2,
                          notes="one thread fills the cache the warm runs use"))
    for i in (1, 2, 3):
        lane_race.append(dict(r_common, name=f"race_warm_3threads_{i}", profile="compiled",
                              cwd=f"{work}/race",
                              cmd=rc + ["--threads", "3"], env=cache("race_warm"), timeout=race_t,
                              notes="3 threads on the cache race_warmup_1thread filled"))
    for i in (2, 3):
        lane_race.append(dict(r_common, name=f"race_cold_3threads_{i}", profile="compiled",
                              cwd=f"{work}/race",
                              cmd=rc + ["--threads", "3"], env=cache(f"race_cold{i}"), timeout=race_t,
                              notes="3 threads, cold (empty) cache, repetition"))
    plan = {"python": py, "root": root,
            "env": {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
                    "NVSHMEM_DISABLE_NVLS": "1",
                    "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
                    "HF_HUB_DISABLE_TELEMETRY": "1"},
            "side_by_side": "5 lanes at once on one GPU (hf, hf_broken, nanogpt, dflash, race); runs.json "
                            "has each run's start/end, so the overlapping runs can be read off it",
            "lanes": {"hf": lane_hf, "hf_broken": lane_hf_broken, "nanogpt": lane_ng, "dflash": lane_df,
                      "race": lane_race}}
    if a.layout == "pairs":
        plan = pairs(plan, T, work)
    elif a.layout == "race":
        plan = race_restarts(plan, rc, r_common, cache, work)
    with open(a.out, "w") as f:
        json.dump(plan, f, indent=1)



def pairs(plan: dict, T, work: str) -> dict:
    """Two lanes: HF (compiled, broken, then the compiled profile resuming the broken run's
    checkpoint, as a rollback does) and nanoGPT then dflash_mini (compiled, broken)."""
    lanes = plan["lanes"]

    def retime(run, limit, suffix="_2lanes"):
        run = dict(run, name=run["name"] + suffix, fallback=None)
        cmd = list(run["cmd"])
        for i, x in enumerate(cmd):
            if x == "--time-limit":
                cmd[i + 1] = str(T(limit))
            elif x.startswith("--time_limit="):
                cmd[i] = f"--time_limit={T(limit)}"
        run["cmd"] = cmd
        return run

    hf_c, hf_r = lanes["hf"][0], lanes["hf"][1]
    hf_b = lanes["hf_broken"][0]
    rollback = retime(hf_r, 45, "_2lanes")
    rollback.update(name="hf_trainer_rollback_resume_2lanes", cwd=hf_b["cwd"],
                    notes="the compiled profile resumes (resume_from_checkpoint=True) the checkpoint that "
                          "hf_trainer_broken_compile_2lanes wrote, in its output dir; inductor cache warm "
                          "from hf_trainer_compiled_2lanes")
    ng, df = lanes["nanogpt"], lanes["dflash"]
    plan["lanes"] = {
        "hf": [retime(hf_c, 65), retime(hf_b, 65), rollback],
        "ng_df": [retime(ng[0], 65), retime(ng[2], 65), retime(df[0], 65), retime(df[2], 65)],
    }
    for lane in plan["lanes"].values():
        for run in lane:
            run["cwd"] = run["cwd"] + "_2l"
            run["timeout"] = min(run["timeout"], 200)
    plan["side_by_side"] = ("2 lanes at once on one GPU (hf; nanogpt then dflash_mini); runs.json has each "
                            "run's start/end")
    return plan


def race_restarts(plan: dict, rc: list, r_common: dict, cache, work: str) -> dict:
    """The race alone. Lane `restarts`: 3 threads on ONE cache that starts empty, restarted after each
    hang or failure (what gpujob's compile_race restart does), 6 tries at most (later tries that find
    the race won still record how it behaves once converged). Lane `warm`: a 1-thread warmup, then
    5 tries of 3 threads on the cache it filled."""
    restarts = [dict(r_common, name=f"race_restart_{i}", profile="compiled", cwd=f"{work}/race_r",
                     cmd=rc + ["--threads", "3"], env=cache("race_restarts"), timeout=45, min_time=20,
                     notes=f"try {i} of 3 threads on one inductor/triton cache that was empty before try 1")
                for i in range(1, 7)]
    warm = [dict(r_common, name="race_warmup_1thread_b", profile="compiled", cwd=f"{work}/race_w",
                 cmd=rc + ["--threads", "1"], env=cache("race_warm_b"), timeout=120,
                 notes="one thread fills the cache the warm tries use")]
    warm += [dict(r_common, name=f"race_warm_3threads_b{i}", profile="compiled", cwd=f"{work}/race_w",
                  cmd=rc + ["--threads", "3"], env=cache("race_warm_b"), timeout=60,
                  notes="3 threads on the cache race_warmup_1thread_b filled") for i in range(1, 6)]
    plan["lanes"] = {"restarts": restarts, "warm": warm}
    plan["side_by_side"] = "2 lanes at once on one GPU (restarts, warm); runs.json has each run's start/end"
    return plan


if __name__ == "__main__":
    main()
