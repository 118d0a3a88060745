#!/usr/bin/env bash
# The shipped jobs/dflash.yaml, run for real with SpecForge 0.2.0 (offline DFlash) on the `local`
# kind, pointed at bench/recipes_gpu/specforge_tiny.py's download-free target and features by
# `submit --set` alone. From the repo root:
#   bash bench/recipes_gpu/specforge_device.sh            # the device: python3, cuda, .whl carried
#   PY=.sfvenv/bin/python DEVICE=cpu SKIP_WHEELS=1 bash bench/recipes_gpu/specforge_device.sh
# Act 1: profile `compiled` (the base interpreter as it is) trains until it is known-good, then is
# stopped. Act 2: a new job on `broken` (TORCHDYNAMO_DISABLE=1: flex_attention runs eagerly) must
# be rolled back to `compiled` by gpujob itself and resume from SpecForge's own {run_id}-stepN
# checkpoint; stopped 20 s after the rollback's timing is recorded. What it leaves: $OUT (on the
# device the run tool's own $OUT: figures come back). Exit 0: both acts done; 3-5 setup, 6 act 1
# never known-good, 7 act 2 never rolled back. On this 2-core CPU (DEVICE=cpu, broken = 1 thread)
# it took 3.3 and 4.7 min in two runs (act 1 95 and 80 s, act 2 96 and 202 s: a noisy shared CPU); on the H200 add the cold flex_attention compile of
# act 1's warmup. Worst case ACT1_S + ACT2_S + ~60 s, under the device's 600 s a call.
set -u
PY=$(command -v "${PY:-python3}") || { echo "no ${PY:-python3}"; exit 3; }
case $PY in /*) ;; *) PY=$PWD/$PY ;; esac  # absolute (not resolved: a venv's python is a link): the job's PATH is the login one
DEVICE=${DEVICE:-cuda}
OUT=${OUT:-/tmp/sfout}
W=${W:-/tmp/sfw}
ACT1_S=${ACT1_S:-240}   # at most this long for act 1 to reach known-good
ACT2_S=${ACT2_S:-200}   # at most this long for act 2's rollback
BROKEN_ENV=${BROKEN_ENV:-"{TORCHDYNAMO_DISABLE: '1'}"}  # on CPU (nothing compiles) add OMP_NUM_THREADS: '1'
mkdir -p "$OUT" "$W"
say() { echo "[specforge_device $(date -u +%H:%M:%S)] $*"; }

. bench/recipes_gpu/sf_common.sh
sf_wheels  # SITE: with SKIP_WHEELS, where they were installed already (the jobs get it as PYTHONPATH)
"$PY" -c 'import torch, transformers, pydantic, specforge, importlib.metadata as m
print("torch", torch.__version__, "cuda", torch.version.cuda, "transformers", transformers.__version__,
      "pydantic", pydantic.VERSION, "specforge", m.version("specforge"))' | tee "$OUT/versions.txt" || exit 3

sf_tiny

sf_hosts
gj() { "$PY" -m gpujob.entry "$@"; }
EXTRA=""; [ "$DEVICE" = cpu ] && EXTRA=" training.fsdp_sharding=NO_SHARD"  # FSDP needs an accelerator
PROFILES="[{name: compiled, system_site_packages: true, python: $PY},
 {name: broken, system_site_packages: true, python: $PY, env: $BROKEN_ENV}]"
sets() {  # $1: the job's workdir, $2: the profile it starts on
  printf '%s\0' \
    --set "workdir=$1" --set "profile=$2" \
    --set "train.command=python -m specforge.cli train -c $W/tiny/run.yaml output_dir={workdir}/outputs run_id=dflash$EXTRA" \
    --set "throughput.tokens_per_step=$TPS" \
    --set 'requirements=[]' --set "env.PYTHONPATH=$SITE" \
    --set "profiles=$PROFILES" --set 'rollback.fallback=[compiled]' \
    --set throughput.initial_delay=15s --set throughput.good_after=20s --set throughput.settle.timeout=30s \
    --set throughput.no_data_timeout=120s --set train.checkpoint.every=10s
  [ -n "${NO_STANDBY:-}" ] && printf '%s\0' --set train.standby=null  # act 2's rollback onto a fresh interpreter
}
job_of() { sed -n 's/^submitted \([^ ]*\) .*/\1/p' "$1" | head -1; }
collect() {  # job, act
  gj status "$1" --json > "$OUT/$2-status.json" 2>&1
  cp "$W/root/jobs/$1/"{events.jsonl,samples.jsonl,job.log,train.log,warmup.log,trace.jsonl.gz,job.json} "$OUT/" 2>/dev/null
  for f in events.jsonl samples.jsonl job.log train.log warmup.log trace.jsonl.gz job.json; do
    [ -f "$OUT/$f" ] && mv "$OUT/$f" "$OUT/$2-$f"; done
}

say "plan"; xargs -0 -a <(sets "$W/job1" compiled) "$PY" -m gpujob.entry submit jobs/dflash.yaml -t lab/box --plan > "$OUT/plan.txt" 2>&1 || { cat "$OUT/plan.txt"; exit 4; }
say "act 1: compiled until known-good"
xargs -0 -a <(sets "$W/job1" compiled) "$PY" -m gpujob.entry submit jobs/dflash.yaml -t lab/box > "$OUT/act1.out" 2>&1
J1=$(job_of "$OUT/act1.out"); [ -n "$J1" ] || { cat "$OUT/act1.out"; exit 5; }
wait_event "$J1" known_good "$ACT1_S"; rc1=$?
gj stop "$J1" >> "$OUT/act1.out" 2>&1; collect "$J1" act1
[ "$rc1" = 0 ] || { say "act 1: $J1 never known-good in ${ACT1_S}s"; tail -30 "$OUT/act1-job.log"; exit 6; }
say "act 2: broken, rolled back by gpujob to compiled"
xargs -0 -a <(sets "$W/job2" broken) "$PY" -m gpujob.entry submit jobs/dflash.yaml -t lab/box > "$OUT/act2.out" 2>&1
J2=$(job_of "$OUT/act2.out"); [ -n "$J2" ] || { cat "$OUT/act2.out"; exit 5; }
wait_event "$J2" rollback_timing "$ACT2_S"; rc2=$?
[ "$rc2" = 0 ] && sleep 20
gj stop "$J2" >> "$OUT/act2.out" 2>&1; collect "$J2" act2
gj status "$J2" | tee "$OUT/act2-status.txt"
ls "$W/job2/outputs" > "$OUT/act2-checkpoints.txt" 2>&1
[ "$rc2" = 0 ] || { say "act 2: no rollback in ${ACT2_S}s"; exit 7; }
say "done: $J1 $J2 (figures: $OUT)"
