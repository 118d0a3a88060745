"""The CPU rehearsal's entry point for the torchtitan lane: ``torchrun ... -m titan_cpu
ARGS`` is ``-m torchtitan.train ARGS`` (its ``main(Trainer)``, as its ``__main__``
block calls it) on a machine without a GPU. Not used on the GPU.

torchtitan (0.2.2 as 0.3.0) takes its device from
``torch._utils._get_available_device_type()``, falls back to "cuda" when there is
none (tools/utils.py) and calls ``torch.cuda.set_device``. Here the answer is "cpu",
so its process group is gloo (torch's own device -> backend map), and ``torch.cpu``
gets the few device queries torchtitan makes (its metrics' memory figures: zeros;
its barrier's ``device_ids=[current_device()]``: an index, since "cpu" is refused).
With ``BENCH_STEP_DELAY`` set (the rehearsal's ``broken`` profile: a CPU shows no
compiled/eager gap), each train step sleeps that many seconds after it.
"""

import os
import time
import types

import torch
import torch._utils


def _patch() -> None:
    torch._utils._get_available_device_type = lambda: "cpu"
    props = types.SimpleNamespace(name="cpu", total_memory=1 << 40)
    fill = {"get_device_name": lambda *a, **k: "cpu", "get_device_properties": lambda *a, **k: props,
            "memory_stats": lambda *a, **k: {}, "reset_peak_memory_stats": lambda *a, **k: None,
            "empty_cache": lambda *a, **k: None, "set_device": lambda *a, **k: None,
            "current_device": lambda: 0}
    for name, fn in fill.items():
        if not hasattr(torch.cpu, name) or name in ("set_device", "current_device"):
            setattr(torch.cpu, name, fn)


def _slowed(trainer: type) -> type:
    delay = float(os.environ.get("BENCH_STEP_DELAY") or 0)
    if delay <= 0:
        return trainer

    class Slowed(trainer):  # type: ignore[misc,valid-type]
        def train_step(self, *a, **k):
            out = super().train_step(*a, **k)
            time.sleep(delay)
            return out
    return Slowed


if __name__ == "__main__":
    _patch()
    from torchtitan.train import Trainer, main

    main(_slowed(Trainer))
