"""``kind: ssh``: a Proxmox host reached over SSH, its LXC containers entered with
``pct exec`` (gpujob/transport/pct.py) over that one connection."""

from __future__ import annotations

from pathlib import Path

from gpujob.errors import ConnectError, GpujobError
from gpujob.kinds.base import AddCheck, CheckStatus, Kind, Opened
from gpujob.steps import Step
from gpujob.transport.base import Transport
from gpujob.transport.pct import PctTransport

_said: set[str] = set()


def _notes(settings) -> list[str]:
    return settings.notes + (settings.jump.notes if settings.jump is not None else [])


SSH_FIELDS = ("address", "port", "user", "identity_file", "known_hosts", "proxy_jump")


class SshKind(Kind):
    name = "ssh"
    kept_connection = True
    host_fields = SSH_FIELDS
    container_fields = ("vmid", "home")
    container_required = ("vmid",)
    boot_hooks = True
    ships_uv = True

    def connect(self, host_name, host, *, accept_new: bool) -> Transport:
        import sys

        from gpujob.transport.ssh import SshTransport  # paramiko: only for ssh hosts
        from gpujob.transport.ssh_config import ssh_settings
        settings = ssh_settings(host_name, host)
        for note in _notes(settings):
            if note not in _said:  # once per process
                _said.add(note)
                sys.stderr.write(f"gpujob: note: {note}\n")
        return SshTransport(settings, accept_new=accept_new)

    def reach_files(self, host_name, host) -> list[str]:
        from gpujob.transport.ssh_config import ssh_settings
        from gpujob.transport.ssh_include import config_files
        files = config_files(Path("~/.ssh/config").expanduser())
        try:
            s = ssh_settings(host_name, host)
        except GpujobError:  # the command that uses the host says what is wrong
            return files
        return files + [str(x.known_hosts) for x in (s, s.jump) if x is not None]

    def unhonoured(self, host_name, host) -> list[str]:
        from gpujob.transport.ssh_config import ssh_settings
        try:
            return _notes(ssh_settings(host_name, host))
        except GpujobError:
            return []

    def open(self, host, entry, cname, container) -> Opened:
        ssh = host()
        home = container.home or "~/.gpujob"
        if home.startswith("~"):
            home = "/root" + home[1:]  # pct exec runs as root in the container
        pct = PctTransport(ssh, container.vmid, pct=entry.pct, name=cname)
        return Opened(pct, ssh, home.rstrip("/"), "python3", vmid=container.vmid)

    def plan_connect(self, target) -> list[Step]:
        mux = target.transport.mux_argv()
        mux[-1] = "<gpujob exec channel: gpujob/transport/mux_server.py>"
        return [Step("connect", "laptop", f"ssh to {target.host_transport.describe()} "
                     "(one connection, strict host key)"),
                Step("channel", "host", "open one exec channel into the container; the container "
                     "commands below run over it (a pct exec each when the container lacks python3)",
                     mux)]

    def gather(self, target, facts: dict) -> bool:
        host = target.host_transport
        try:
            facts["host"] = {"ok": True, "key": host.host_key(), "where": host.describe()}
        except ConnectError as e:
            facts["host"] = {"ok": False, "error": e.message, "hint": e.hint or ""}
            return False
        st = target.transport.status_result()
        facts["pct"] = {"exit": st.exit_code, "out": st.out, "err": st.err}
        if st.exit_code != 0 or "running" not in st.out:
            return False
        r = host.run(["cat", "/proc/driver/nvidia/version"], timeout=30)
        facts["host_driver"] = r.text if r.ok else None
        return True

    def judge(self, facts: dict, add: AddCheck) -> bool:
        host = facts.get("host", {})
        if not host.get("ok"):
            add("host", CheckStatus.FAIL, host.get("error", "not reached"), host.get("hint", ""))
            return False
        add("host", CheckStatus.OK, f"{host['where']} ({host['key']})")
        pct = facts["pct"]
        if pct["exit"] == 127:
            add("pct", CheckStatus.FAIL, "pct not found on the host",
                "set `pct:` in hosts.yaml to its path, or run on a Proxmox node")
            return False
        if pct["exit"] != 0:
            text = pct["err"] or pct["out"]
            if "does not exist" in text:
                add("pct", CheckStatus.OK, "pct present")
                add("container", CheckStatus.FAIL, text,
                    "check the vmid in hosts.yaml (`pct list` on the host lists them)")
            elif "permission" in text.lower() or "must be root" in text.lower():
                add("pct", CheckStatus.FAIL, text, "pct needs root: set `user: root` for this host")
            else:
                add("pct", CheckStatus.FAIL, text or f"pct status exited {pct['exit']}")
            return False
        add("pct", CheckStatus.OK, "pct present")
        if "running" not in pct["out"] or "not running" in pct["out"]:
            add("container", CheckStatus.FAIL, pct["out"],
                f"start it on the host: pct start {facts.get('vmid')}")
            return False
        add("container", CheckStatus.OK, pct["out"])
        return True

    def status(self, target) -> str:
        return target.transport.status()

    def reconnect(self, target) -> None:
        target.host_transport.reconnect()
