"""Failure signals of a trainer's output and exit (agent/judge/signals.py), pure."""

import pytest

from gpujob.agent.judge.signals import classify_exit, find_signature, scan_line


# ---------------------------------------------------------------- classify

SIGS = ["is_fx_symbolic_tracing", "undefined symbol: cuLaunch"]
TRACE = [
    "Traceback (most recent call last):",
    '  File "train.py", line 10, in <module>',
    "AttributeError: module 'torch.fx' has no attribute 'is_fx_symbolic_tracing'",
]
OOM = ["torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB."]


def test_classify_ok():
    assert classify_exit(0, None, TRACE, SIGS)[0] == "ok"


def test_classify_signature_wins():
    name, reason = classify_exit(1, None, TRACE + OOM, SIGS)
    assert name == "error_signature"
    assert "error signature 'is_fx_symbolic_tracing' in train.log" in reason
    assert classify_exit(137, None, ["\x1b[31mis_fx_symbolic_tracing\x1b[0m"], SIGS)[0] == "error_signature"
    assert "in out.log" in classify_exit(1, None, TRACE, SIGS, log_name="out.log")[1]


def test_classify_cuda_oom():
    for line in OOM + ["torch.cuda.OutOfMemoryError: x", "RuntimeError: CUDA out of memory."]:
        name, reason = classify_exit(1, None, ["step 1", line], SIGS)
        assert name == "cuda_oom" and "exit" in reason


def test_classify_oom_killed():
    for rc, sig in [(137, None), (-9, None), (None, 9), (137, 9)]:
        name, reason = classify_exit(rc, sig, ["step 1"], SIGS)
        assert name == "oom_killed", (rc, sig)
        assert "SIGKILL" in reason and "OOM killer" in reason
    assert classify_exit(137, None, [], SIGS)[1] == "killed by SIGKILL (exit 137), likely the OOM killer"


def test_classify_crash():
    name, reason = classify_exit(1, None, ["step 1", "RuntimeError: boom", ""], SIGS)
    assert name == "crash" and reason == "exited with code 1: RuntimeError: boom"
    assert classify_exit(139, None, [], SIGS) == ("crash", "killed by SIGSEGV (exit 139)")
    assert classify_exit(-11, None, [], SIGS)[1] == "killed by SIGSEGV (signal 11)"
    assert classify_exit(None, 15, [], SIGS)[0] == "crash"
    assert classify_exit(None, None, [], SIGS) == ("crash", "exit status unknown")
    assert classify_exit(2, None, ["usage: train.py"], [""])[1] == "exited with code 2: usage: train.py"


def test_scan_line_and_find_signature():
    assert scan_line("AttributeError: ... is_fx_symbolic_tracing", SIGS) == "error_signature"
    assert scan_line(OOM[0], SIGS) == "cuda_oom"
    assert scan_line("step 10 loss 1.0", SIGS) is None
    assert scan_line("anything", [""]) is None  # empty signature never matches
    assert (find_signature(["a", "undefined symbol: cuLaunchKernel", TRACE[2]], SIGS) == "undefined symbol: "
                                                                                         "cuLaunch")


@pytest.mark.parametrize("line,name", [
    ("[rank3]:[E] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=9)", "nccl_timeout"),
    ("NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.", "hw_error"),
    ("RuntimeError: CUDA error: uncorrectable ECC error encountered", "hw_error"),
    ("Failed to initialize NVML: Driver/library version mismatch", "driver_mismatch"),
    ("RuntimeError: The NVIDIA driver on your system is too old (CUDA driver version is insufficient)",
     "driver_mismatch"),
])
def test_classify_exit_names_the_failures_a_restart_policy_tells_apart(line, name):
    got, reason = classify_exit(1, None, ["step 9", line], [])
    assert got == name and line[:40] in reason
