"""``gpujob doctor``: checks of a target over one connection.

Gathering (``gather``) does the I/O; judging (``judge``) is pure: facts in,
checks out, each ok / warn / fail with a one-line fix.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from typing import Sequence

from gpujob import kinds
from gpujob.kinds.base import CheckStatus
from gpujob.errors import GpujobError
from gpujob.ops.target import Target

MIN_FREE_WARN = 20 * 2**30
MIN_FREE_FAIL = 2 * 2**30
#: Minimum driver for a CUDA major version (NVIDIA's compatibility table).
CUDA_MIN_DRIVER = {13: "580", 12: "525.60.13", 11: "450.80.02"}


@dataclass
class Check:
    name: str
    status: CheckStatus  # a plain "ok"/"warn"/"fail" is taken too (and checked)
    detail: str
    hint: str = ""

    def __post_init__(self):
        self.status = CheckStatus(self.status)

    def as_dict(self) -> dict:
        return dict(asdict(self), status=self.status.value)


def version_tuple(v: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", v))


def host_driver(proc_version: str | None) -> str | None:
    """``580.65.06`` from /proc/driver/nvidia/version's ``Kernel Module  580.65.06`` line."""
    m = re.search(r"Kernel Module(?:\s+for\s+\S+)?\s+(\d+(?:\.\d+)+)", proc_version or "")
    return m.group(1) if m else None


def gather(target: Target, workdir: str | None = None) -> dict:
    """Facts about the target; stops early (with what it knows) when a layer fails."""
    facts: dict = {"kind": target.kind, "label": target.label, "vmid": target.vmid}
    if not target.driver.gather(target, facts):
        return facts
    try:
        facts["probe"] = target.probe(workdir).to_dict()  # facts stay JSON (doctor --json)
    except GpujobError as e:
        facts["probe_error"] = e.message
    return facts


def with_fixes(checks: list[Check]) -> list[Check]:
    """Every failed or warned check with a fix: the specific one it has, else one by what failed."""
    for c in checks:
        if c.status != CheckStatus.OK and not c.hint:
            c.hint = fallback_fix(c.name, c.detail)
    return checks


def fallback_fix(name: str, detail: str) -> str:
    d = detail.lower()
    if name in ("host", "connect"):
        if "banner" in d or "protocol" in d:
            return ("something answered that is not sshd: check `address` and `port` in hosts.yaml "
                    "(or ~/.ssh/config) and that sshd listens there: ssh -p PORT USER@ADDRESS true")
        if "timed out" in d or "timeout" in d:
            return ("check the address, the network path (VPN, firewall) and that the host is up; "
                    "raise `connect_timeout` in hosts.yaml for slow links")
        return ("check `address`, `port` and `user` in hosts.yaml (or ~/.ssh/config), and that sshd runs "
                "there: ssh -p PORT USER@ADDRESS true")
    if name == "pct":
        return "run `pct status VMID` on the host as root to see why it fails"
    if name == "python3":
        return "check that the container runs and has python3 3.8+: gpujob exec CT -- python3 -V"
    return "see README: Troubleshooting"


def judge(facts: dict, *, expected_gpus: int | None = None, cudas: Sequence[str] = ()) -> list[Check]:
    return with_fixes(_judge(facts, expected_gpus=expected_gpus, cudas=cudas))


def _judge(facts: dict, *, expected_gpus: int | None = None, cudas: Sequence[str] = ()) -> list[Check]:
    checks: list[Check] = []
    add = lambda *a: checks.append(Check(*a))  # noqa: E731
    if not kinds.get(facts["kind"]).judge(facts, add):
        return checks
    if "probe_error" in facts:
        err = facts["probe_error"]
        hint = "apt install python3 python3-venv in the container" if "python3" in err else ""
        add("python3", CheckStatus.FAIL, err, hint)
        return checks
    p = facts["probe"]
    add("python3", CheckStatus.OK, f"python {p['python']} ({p['system']} {p['machine']})")
    if p.get("venv"):
        add("venv", CheckStatus.OK, "venv and ensurepip importable")
    else:
        add("venv", CheckStatus.WARN, "ensurepip missing (python3-venv not installed)",
            "only needed when gpujob falls back to pip: apt install python3-venv")
    if p.get("uv"):
        add("uv", CheckStatus.OK, p["uv"])
    else:
        add("uv", CheckStatus.WARN, "no uv in the container",
            "gpujob ships its own uv there when the CPU and OS match, else installs with pip")
    free = p.get("disk_free", 0)
    gib = free / 2**30
    status = CheckStatus.OK if free >= MIN_FREE_WARN else \
        CheckStatus.WARN if free >= MIN_FREE_FAIL else CheckStatus.FAIL
    add("disk", status, f"{gib:.1f} GiB free at {p.get('disk_path')}",
        "" if status == CheckStatus.OK else "a torch CUDA venv takes ~6 GiB and compile caches grow: free "
                                            "some space")
    checks.extend(gpu_checks(p, facts.get("host_driver"), expected_gpus, cudas))
    return checks


def gpu_checks(p: dict, host_proc: str | None, expected: int | None, cudas) -> list[Check]:
    smi = p.get("nvidia_smi")
    if p.get("uvm"):
        uvm = Check("nvidia-uvm", CheckStatus.OK, "/dev/nvidia-uvm present")
    else:
        uvm = Check("nvidia-uvm", CheckStatus.FAIL if smi and smi.get("gpus") else CheckStatus.WARN,
                    "/dev/nvidia-uvm missing",
                    "on the host: nvidia-modprobe -u -c=0 (it vanishes after a host reboot), "
                    "then restart the container")
    return _gpu_checks(p, smi, host_proc, expected, cudas) + [uvm]


def _gpu_checks(p: dict, smi, host_proc: str | None, expected: int | None, cudas) -> list[Check]:
    out: list[Check] = []
    if smi is None:
        out.append(Check("gpus", CheckStatus.WARN, "nvidia-smi not found in the container: no GPU visible",
                         "pass the GPUs into the container (lxc.cgroup2.devices.allow, /dev/nvidia* mounts) "
                         "and install the NVIDIA user-space driver matching the host"))
        return out
    if not smi.get("ok"):
        err = smi.get("error", "")
        hint = ("the container's NVIDIA libraries must match the host's kernel module exactly"
                if "mismatch" in err.lower() else "check the device mounts and driver in the container")
        out.append(Check("gpus", CheckStatus.FAIL, f"nvidia-smi failed: {err}", hint))
        return out
    gpus = smi.get("gpus", [])
    n = len(gpus)
    if expected is not None and n != expected:
        out.append(Check("gpus", CheckStatus.FAIL, f"{n} GPUs visible, hosts.yaml expects {expected}",
                         "check the container's GPU passthrough (lxc.mount.entry for each /dev/nvidiaN)"))
    else:
        names = ", ".join(sorted({g[1] for g in gpus if len(g) > 1})) or "?"
        out.append(Check("gpus", CheckStatus.OK if n else CheckStatus.WARN, f"{n} GPUs ({names})"))
    drv = gpus[0][2] if gpus and len(gpus[0]) > 2 else None
    hdrv = host_driver(host_proc if host_proc is not None else p.get("proc_driver"))
    if drv and hdrv:
        if drv != hdrv:
            out.append(Check("driver", CheckStatus.FAIL,
                             f"container driver {drv} != host kernel module {hdrv}",
                             f"install the {hdrv} NVIDIA user-space libraries in the container "
                             "(--no-kernel-module)"))
        else:
            out.append(Check("driver", CheckStatus.OK, f"driver {drv} matches the host kernel module"))
    for cuda in cudas:
        need = CUDA_MIN_DRIVER.get(version_tuple(cuda)[0]) if cuda else None
        if need and drv:
            if version_tuple(drv) < version_tuple(need):
                out.append(Check(f"cuda {cuda}", CheckStatus.FAIL, f"driver {drv} is older than {need}, "
                                 f"the minimum for CUDA {cuda} wheels", "upgrade the host driver, "
                                 "or use a profile built for an older CUDA"))
            else:
                out.append(Check(f"cuda {cuda}", CheckStatus.OK, f"driver {drv} >= {need}"))
    return out
