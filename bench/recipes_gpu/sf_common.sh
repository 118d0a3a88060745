# Sourced by specforge_device.sh and dflash_1gpu_device.sh (from the repo root): what both do before
# their own acts. The caller sets PY (absolute), DEVICE, OUT, W and say(); SKIP_WHEELS and SITE as
# their headers say.

# the wheels of specforge_wheels.txt into /tmp/site (unless SKIP_WHEELS: then SITE is where they are),
# and the environment every gpujob call and job of the script gets
sf_wheels() {
  SITE=${SITE:-}
  if [ -z "${SKIP_WHEELS:-}" ]; then  # pydantic & co, typing-extensions>=4.16, specforge --no-deps
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl || { say "wheel install failed"; exit 3; }
    SITE=/tmp/site
  fi
  export PYTHONPATH="${SITE:+$SITE:}$PWD" UV_OFFLINE=1 UV_PYTHON_DOWNLOADS=never PYTHONUNBUFFERED=1
}

# specforge_tiny.py's target, features and run.yaml in $W/tiny (extra arguments go to it); TPS: its
# tokens per sample
sf_tiny() {
  "$PY" bench/recipes_gpu/specforge_tiny.py --out "$W/tiny" --device "$DEVICE" "$@" | tee "$OUT/tiny.txt" || exit 3
  TPS=$(sed -n 's/^tokens_per_sample=//p' "$OUT/tiny.txt")
}

# one local container lab/box with its home in $W/root, and gpujob's own state in $W
sf_hosts() {
  cat > "$W/hosts.yaml" <<HOSTS
hosts:
  lab:
    kind: local
    env_passthrough: ["NCCL_*", "LD_LIBRARY_PATH", "CUDA_HOME", "CUDA_PATH"]
    containers:
      box: {root: $W/root}
HOSTS
  export GPUJOB_HOSTS="$W/hosts.yaml" XDG_STATE_HOME="$W/state" COLUMNS=200
}

wait_event() {  # job, event type, seconds
  local t=0
  until grep -q "\"type\": *\"$2\"" "$W/root/jobs/$1/events.jsonl" 2>/dev/null; do
    sleep 1; t=$((t + 1)); [ "$t" -ge "$3" ] && return 1
  done
  return 0  # (the loop's own status is its body's last test's)
}
