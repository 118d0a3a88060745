#!/usr/bin/env bash
# jobs/dflash-1gpu.yaml as a user runs it on one GPU (issue 34 item 3): the shipped file and
# jobs/dflash/run.yaml copied, only their CHANGE ME lines edited (run.yaml: the target model, the
# features, max_length, batch_size, save_interval; the spec: target, tokens_per_step,
# train.checkpoint.every), then `gpujob submit`, a first finished checkpoint, a `gpujob rollback`
# by hand (cu128 -> cu130, resumed from this job's newest SpecForge checkpoint), `gpujob stop`.
# What the device cannot do as a user's box does, each a recorded edit ($OUT/edits.json):
#   - no network: the two profiles keep their names (cu128, cu130) but are the base interpreter
#     (system_site_packages) instead of PyTorch's index, requirements=[] and the wheels of
#     specforge_wheels.txt preinstalled (env.PYTHONPATH);
#   - the tiny, download-free target and features of specforge_tiny.py: no tokenizer (so
#     model.mask_token_id), 64 samples of 256 tokens (so training.num_anchors 64 and
#     num_epochs large: one epoch is 32 steps).
# From the repo root:
#   bash bench/recipes_gpu/dflash_1gpu_device.sh                     # the device (.whl carried)
#   PY=/tmp/titan-venv/bin/python GJPY=.venv/bin/python DEVICE=cpu SKIP_WHEELS=1 bash bench/recipes_gpu/dflash_1gpu_device.sh
# The job's workdir is the shipped spec's, /root/dflash, on this machine (the local kind): the script
# writes there, as the user's job would. Exit 0: trained, checkpointed, rolled back by hand and resumed, stopped; 3-5 setup; 6 no finished
# checkpoint in CKPT_S; 7 no resumed training in ROLL_S.
set -u
PY=$(command -v "${PY:-python3}") || { echo "no ${PY:-python3}"; exit 3; }
case $PY in /*) ;; *) PY=$PWD/$PY ;; esac
GJPY=${GJPY:-$PY}  # the controller's interpreter (gpujob's own needs); the jobs run $PY
DEVICE=${DEVICE:-cuda}
OUT=${OUT:-/tmp/sf1out}
W=${W:-/tmp/sf1w}
CKPT_S=${CKPT_S:-240}
ROLL_S=${ROLL_S:-180}
mkdir -p "$OUT" "$W"
say() { echo "[dflash_1gpu $(date -u +%H:%M:%S)] $*"; }

. bench/recipes_gpu/sf_common.sh
sf_wheels
sf_tiny --save-interval 100

# the user's copy of the shipped files, and the CHANGE ME edits of run.yaml
rm -rf "$W/user"; mkdir -p "$W/user/dflash"
cp jobs/dflash-1gpu.yaml "$W/user/"; cp jobs/dflash/run.yaml "$W/user/dflash/"
[ -f jobs/dflash/warmup_drafter.py ] && cp jobs/dflash/warmup_drafter.py "$W/user/dflash/"
"$PY" - "$W" "$DEVICE" > "$OUT/edits.json" <<'PYEOF' || exit 3
import json, sys
import yaml
w, device = sys.argv[1], sys.argv[2]
path = f"{w}/user/dflash/run.yaml"
cfg = yaml.safe_load(open(path))
tiny = json.load(open(f"{w}/tiny/run.yaml"))
change_me = {("model", "target_model_path"): tiny["model"]["target_model_path"],
             ("data", "hidden_states_path"): tiny["data"]["hidden_states_path"],
             ("data", "max_length"): tiny["data"]["max_length"],
             ("training", "batch_size"): tiny["training"]["batch_size"],
             ("training", "save_interval"): 100}
stand_in = {("model", "mask_token_id"): tiny["model"]["mask_token_id"],
            ("training", "num_anchors"): tiny["training"]["num_anchors"],
            ("training", "num_epochs"): tiny["training"]["num_epochs"]}
if device == "cpu":
    stand_in[("training", "attention_backend")] = "sdpa"
for (a, b), v in {**change_me, **stand_in}.items():
    cfg[a][b] = v
open(path, "w").write(yaml.safe_dump(cfg, sort_keys=False))
print(json.dumps({"run.yaml CHANGE ME": {f"{a}.{b}": v for (a, b), v in change_me.items()},
                  "run.yaml stand-in": {f"{a}.{b}": v for (a, b), v in stand_in.items()},
                  "deployment.trainer.nproc_per_node": cfg["deployment"]["trainer"]["nproc_per_node"]}))
PYEOF

sf_hosts
gj() { (cd "$W/user" && "$GJPY" -m gpujob.entry "$@"); }
BE=""; [ "$DEVICE" = cpu ] && BE=", env: {OMP_NUM_THREADS: '2'}"
sets() {
  printf '%s\0' --set target=lab/box --set "throughput.tokens_per_step=$TPS" --set train.checkpoint.every=10s \
    --set "profiles=[{name: cu128, system_site_packages: true, python: $PY$BE}, {name: cu130, system_site_packages: true, python: $PY$BE}]" \
    --set 'requirements=[]' --set "env.PYTHONPATH=$SITE"
  [ "$DEVICE" = cpu ] && printf '%s\0' --set "train.command=python -m specforge.cli train -c dflash/run.yaml output_dir={workdir}/outputs run_id=dflash deployment.trainer.nproc_per_node=1 training.fsdp_sharding=NO_SHARD"
  return 0
}
run_gj() { (cd "$W/user" && xargs -0 -a <(sets) "$GJPY" -m gpujob.entry "$@"); }

say "plan"; run_gj submit dflash-1gpu.yaml --plan > "$OUT/plan.txt" 2>&1 || { cat "$OUT/plan.txt"; exit 4; }
say "submit (cu128)"
T0=$(date +%s.%N)
run_gj submit dflash-1gpu.yaml > "$OUT/submit.txt" 2>&1
J=$(sed -n 's/^submitted \([^ ]*\) .*/\1/p' "$OUT/submit.txt" | head -1); [ -n "$J" ] || { cat "$OUT/submit.txt"; exit 5; }
wait_event "$J" checkpoint_finished "$CKPT_S"; rc1=$?
sleep 5
gj status "$J" > "$OUT/status-before.txt" 2>&1
if [ "$rc1" = 0 ]; then
  say "rollback by hand"
  gj rollback "$J" > "$OUT/rollback.txt" 2>&1; echo "rc=$?" >> "$OUT/rollback.txt"
  wait_event "$J" rollback_timing "$ROLL_S"; rc2=$?
  [ "$rc2" = 0 ] && sleep 20
else
  rc2=1
fi
gj status "$J" > "$OUT/status-after.txt" 2>&1
gj stop "$J" > "$OUT/stop.txt" 2>&1; echo "rc=$?" >> "$OUT/stop.txt"
sleep 2
gj status "$J" --json > "$OUT/status.json" 2>&1
cp "$W/root/jobs/$J/events.jsonl" "$W/root/jobs/$J/job.log" "$W/root/jobs/$J/trace.jsonl.gz" "$OUT/" 2>/dev/null
ls -R /root/dflash/outputs > "$OUT/outputs.txt" 2>&1
echo "{\"job\": \"$J\", \"t0\": $T0, \"checkpoint\": $rc1, \"rolled_back\": $rc2}" > "$OUT/result.json"
[ "$rc1" = 0 ] || { say "no finished checkpoint in ${CKPT_S}s"; tail -30 "$OUT/job.log"; exit 6; }
[ "$rc2" = 0 ] || { say "no resumed run in ${ROLL_S}s"; tail -30 "$OUT/job.log"; exit 7; }
say "done: $J (figures: $OUT)"
