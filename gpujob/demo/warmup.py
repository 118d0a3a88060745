"""Demo warmup: 'compiles' kernels into the profile's inductor cache, one GPU at a time."""
import os
import time

cache = os.environ["TORCHINDUCTOR_CACHE_DIR"]
gpu = os.environ.get("CUDA_VISIBLE_DEVICES", "-")
os.makedirs(cache, exist_ok=True)
print(f"warmup on GPU {gpu}: compiling flex_attention kernels into {cache}", flush=True)
time.sleep(0.3)
with open(os.path.join(cache, f"kernel-gpu{gpu}.bin"), "w") as f:
    f.write("compiled\n")
print(f"warmup on GPU {gpu}: done", flush=True)
