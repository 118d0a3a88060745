"""The benchmark's warmup: 'compiles' into the profile's inductor cache, so a
second run on the same profile finds the cache warm and skips it."""
import os
import time

cache = os.environ["TORCHINDUCTOR_CACHE_DIR"]
os.makedirs(cache, exist_ok=True)
print(f"warmup on GPU {os.environ.get('CUDA_VISIBLE_DEVICES', '-')}: compiling into {cache}", flush=True)
time.sleep(0.2)
with open(os.path.join(cache, f"kernel-gpu{os.environ.get('CUDA_VISIBLE_DEVICES', '-')}.bin"), "w") as f:
    f.write("compiled\n")
