"""The boot hook's edits of rc.local: one line per gpujob home, before a closing
`exit 0`, removed without touching the rest."""

from __future__ import annotations

import os

from gpujob.agent.supervisor import boothook


def test_the_hook_goes_in_once_before_exit_0_and_comes_out_cleanly(tmp_path):
    rc = tmp_path / "rc.local"
    rc.write_text("#!/bin/sh -e\n/usr/local/bin/site-setup\n\nexit 0\n")
    os.chmod(rc, 0o644)
    line = boothook.install("/usr/bin/python3", "/root/.gpujob/bin/agent-x.pyz", "/root/.gpujob", str(rc))
    boothook.install("/usr/bin/python3", "/root/.gpujob/bin/agent-y.pyz", "/root/.gpujob", str(rc))  # again
    text = rc.read_text().splitlines()
    assert text[0] == "#!/bin/sh -e" and text[1] == "/usr/local/bin/site-setup" and text[-1] == "exit 0"
    ours = [ln for ln in text if "gpujob-boot /root/.gpujob" in ln]
    assert len(ours) == 1 and "agent-y.pyz" in ours[0] and ours[0].endswith("&  # gpujob-boot /root/.gpujob")
    assert "agent-x.pyz" in line and os.access(rc, os.X_OK)  # made executable: systemd runs it then
    # another home has a line of its own
    boothook.install("/usr/bin/python3", "/data/gj/bin/a.pyz", "/data/gj", str(rc))
    assert boothook.remove("/root/.gpujob", str(rc))
    text = rc.read_text()
    assert "gpujob-boot /root/.gpujob" not in text and "gpujob-boot /data/gj" in text
    assert "/usr/local/bin/site-setup" in text and text.rstrip().endswith("exit 0")
    assert not boothook.remove("/root/.gpujob", str(rc))


def test_a_missing_rc_local_is_created_executable(tmp_path):
    rc = tmp_path / "rc.local"
    boothook.install("/usr/bin/python3", "/h/bin/a.pyz", "/h", str(rc))
    assert rc.read_text().startswith("#!/bin/sh\n") and os.access(rc, os.X_OK)
    assert boothook.hook_line("/usr/bin/python3", "/h/bin/a.pyz", "/h") in rc.read_text()


def test_boot_identity_is_stable_within_a_boot_and_changes_with_init():
    """The kernel's boot id and this PID namespace's init start: what a container restart changes."""
    import subprocess
    import sys
    with open("/proc/sys/kernel/random/boot_id") as f:
        boot = f.read().strip()
    with open("/proc/1/stat") as f:
        init_start = f.read().rsplit(")", 1)[1].split()[19]
    ident = boothook.boot_identity()
    assert ident == f"{boot}/{init_start}" == boothook.boot_identity()
    # a new PID namespace (as a restarted container has) has another init, started later
    code = "from gpujob.agent.supervisor import boothook; print(boothook.boot_identity())"
    p = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-c", code],
                       capture_output=True, text=True, timeout=30)
    assert p.returncode == 0, p.stderr
    other = p.stdout.strip()
    assert other.startswith(f"{boot}/") and other != ident
