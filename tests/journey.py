"""The journey driver the recipe journeys share (tests/bed/test_journey_recipes.py): a person at
a shell, from an empty HOME, `gpujob` on PATH (the installed entry point, the kept connection
on), and the lines they read."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

from helpers import gpujob_argv


class User:
    """An empty HOME, a folder of their own, `gpujob` on PATH."""

    def __init__(self, tmp: Path):
        self.home = tmp / "home"
        self.home.mkdir()
        self.env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUJOB_", "XDG_", "SSH_AUTH"))}
        self.env.update(HOME=str(self.home), COLUMNS="200")
        for k in ("XDG_RUNTIME_DIR", "GPUJOB_CONN_IDLE"):  # the suite's daemons' place (tests/conftest.py)
            if k in os.environ:
                self.env[k] = os.environ[k]
        self.cwd = self.home

    def run(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
        p = subprocess.run([*gpujob_argv(), *args], env=self.env, cwd=self.cwd, capture_output=True,
                           timeout=timeout)
        p.out, p.err = p.stdout.decode(), p.stderr.decode()  # type: ignore[attr-defined]
        return p

    def ok(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
        p = self.run(*args, timeout=timeout)
        assert p.returncode == 0, \
            f"gpujob {' '.join(args)} exited {p.returncode}\n{p.out[-3000:]}\n{p.err[-3000:]}"
        return p

    def hosts_by_hand(self, testbed, home: str) -> Path:
        """README step 2, by hand: ~/.config/gpujob/hosts.yaml for this bed's sshd and keys."""
        config = self.home / ".config" / "gpujob" / "hosts.yaml"
        config.parent.mkdir(parents=True)
        config.write_text(f"""hosts:
  pve1:
    address: 127.0.0.1
    port: {testbed.port}
    user: root
    identity_file: {testbed.user_key}
    known_hosts: {testbed.known_hosts}
    containers:
      ct200: {{vmid: 200, home: {home}}}
""")
        return config


def job_of(text: str, name: str) -> str:
    return re.search(rf"\b({name}-[a-z0-9]{{4}})\b", text).group(1)


BASE_PROFILE = """  - name: base                # the container's own interpreter and packages
    system_site_packages: true
"""


def two_builds(text: str, index: dict) -> str:
    """The CHANGE ME edit of the profiles: the kernels' fast and slow wheel builds, from the index."""
    assert BASE_PROFILE in text, text
    return text.replace(BASE_PROFILE, f"""  - name: fast
    index_url: {index["fast"]}
    packages: ["gpujob-demo-kernels==1.0.0+fast"]
  - name: slow
    index_url: {index["slow"]}
    packages: ["gpujob-demo-kernels==1.0.0+slow"]
""")


def tokens_per_step(text: str, tokens: int) -> str:
    """The CHANGE ME edit of throughput.tokens_per_step, where init wrote one to change."""
    return re.sub(r"(?m)^(  tokens_per_step: )\d+( +# CHANGE ME)", rf"\g<1>{tokens}\2", text)


QUICK = ["--set", "throughput.good_after=4s", "--set", "throughput.window=3", "--set",
         "throughput.failure_limit=2", "--set", "train.checkpoint.every=20s"]
