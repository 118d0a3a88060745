"""A target container and the ways into it, plus the agent shipped there.

``Targets`` keeps one connection per host for the whole gpujob invocation (ssh: one SSH link);
every container of that host is a ``pct exec`` over it. The agent (the stdlib-only
supervisor package as one zipapp) is addressed by its content hash, so an
unchanged agent is never shipped twice.
"""

from __future__ import annotations

import hashlib
import io
import json
import platform
import threading
import zipfile
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple, Sequence, TypeVar

from gpujob import kinds
from gpujob.agent.base import protocol, wire
from gpujob.agent.base.wire import Code
from gpujob.errors import GpujobError, InputError, JobError, RemoteError
from gpujob.transport.base import OnData, Result, Stdin, Transport

if TYPE_CHECKING:  # (its pydantic models: a cold exec may run on a cached View, gpujob/inventory/cache.py)
    from gpujob.inventory.hosts import Inventory
    from gpujob.transport.mux import MuxClient, Pending

# every module of gpujob/agent/ and its wings ships (they are stdlib-only by rule): none can be
# forgotten; each named by its path under gpujob/agent/ (``home/journal.py``)
_AGENT_DIR = Path(__file__).parent.parent / "agent"
AGENT_MODULES = tuple(sorted(p.relative_to(_AGENT_DIR).as_posix() for p in _AGENT_DIR.rglob("*.py")))
AGENT_DATA = ("base/spec_defaults.json",)  # read with pkgutil.get_data (gpujob/agent/base/defaults.py)
AGENT_MAIN = "import sys\nfrom gpujob.agent.main import main\nsys.exit(main())\n"
# Writes the agent zipapp in the container, with each module's bytecode added, compiled by
# the container's own python3 (unchecked hash-based .pyc, which zipimport loads as is): zipimport
# never caches bytecode, and compiling ~20 modules from source cost ~80 ms on every agent call.
# When that cannot be done (an old python3), the sources alone still run.
BOOTSTRAP = ("import io,os,sys,zipfile\nd=sys.argv[1]\nos.makedirs(os.path.dirname(d),exist_ok=True)\n"
             "data=sys.stdin.buffer.read()\n"
             "try:\n"
             " from importlib.util import source_hash\n"
             " from importlib._bootstrap_external import _code_to_hash_pyc\n"
             " b=io.BytesIO(data)\n"
             " with zipfile.ZipFile(b,'a',zipfile.ZIP_DEFLATED) as z:\n"
             "  for n in [i for i in z.namelist() if i.endswith('.py') and i!='__main__.py']:\n"
             "   src=z.read(n)\n"
             "   code=compile(src,d+'/'+n,'exec',dont_inherit=True)\n"
             "   z.writestr(zipfile.ZipInfo(n+'c',(2020,1,1,0,0,0)),"
             "_code_to_hash_pyc(code,source_hash(src),False))\n"
             " data=b.getvalue()\n"
             "except Exception:\n"
             " pass\n"
             "t=d+'.tmp%d'%os.getpid()\nf=open(t,'wb')\nf.write(data)\nf.close()\n"
             "os.replace(t,d)\n")


@lru_cache(maxsize=1)
def agent_zip() -> tuple[bytes, str]:
    """The agent zipapp (deterministic bytes) and its short content hash."""
    pkg = Path(__file__).parent.parent
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        def add(name: str, data: bytes) -> None:
            info = zipfile.ZipInfo(name, date_time=(2020, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(info, data)
        add("__main__.py", AGENT_MAIN.encode())
        add("gpujob/__init__.py", (pkg / "__init__.py").read_bytes())
        for mod in AGENT_MODULES + AGENT_DATA:
            add(f"gpujob/agent/{mod}", (pkg / "agent" / mod).read_bytes())
    data = buf.getvalue()
    return data, hashlib.sha256(data).hexdigest()[:12]


#: how the laptop reports each refusal of the agent (``wire.Code``): the error, so the exit code
#: (errors.py: InputError 2, JobError 5); a code this gpujob does not know is a JobError
REFUSALS: dict[str, type[GpujobError]] = {
    Code.BUSY: JobError, Code.UNKNOWN_JOB: JobError, Code.EXISTS: JobError, Code.NOT_FOUND: JobError,
    Code.CONFLICT: JobError, Code.NEWER_FORMAT: JobError, Code.DAMAGED: JobError,
    Code.BAD_REQUEST: InputError}

_R = TypeVar("_R", bound=wire.Record)


def refusal_error(answer: dict) -> GpujobError:
    """The error a refusal answer (``wire.ErrorAnswer``) reaches the user as."""
    code = answer.get("code")
    code = code if isinstance(code, str) else None
    e = REFUSALS.get(code or "", JobError)(str(answer.get("error") or "refused"))
    e.refusal = code
    return e


def uv_binary() -> Path | None:
    try:
        import uv
        return Path(uv.find_uv_bin())
    except (ImportError, FileNotFoundError):
        return None


class AgentCall(NamedTuple):
    """An agent command sent and not yet awaited (``Target.agent_begin``)."""
    args: tuple
    timeout: float | None
    channel: "MuxClient"
    pending: "Pending"

    def cancel(self) -> None:
        self.channel.cancel(self.pending)


@dataclass
class Target:
    name: str                 # container name, e.g. ct200
    host_name: str
    kind: str                 # a name in gpujob.kinds.REGISTRY ("ssh", "local")
    transport: Transport      # runs argv inside the container
    host_transport: Transport | None  # runs argv on the host below it (ssh kind: the Proxmox host)
    home: str                 # gpujob's home inside the container (absolute)
    python: str               # interpreter for the agent
    vmid: int | None = None
    expected_gpus: int | None = None
    env_passthrough: list = field(default_factory=list)  # glob patterns (hosts.yaml)
    address: str | None = None  # where other nodes reach it (hosts.yaml; None: ask it)
    _probe: wire.ProbeAnswer | None = field(default=None, repr=False)

    @property
    def driver(self) -> kinds.Kind:
        """This target's kind (gpujob/kinds/): plan steps, doctor facts, status, reconnect."""
        return kinds.get(self.kind)

    @property
    def label(self) -> str:
        return f"{self.host_name}/{self.name}"

    @property
    def agent_path(self) -> str:
        return f"{self.home}/bin/agent-{agent_zip()[1]}.pyz"

    def agent_argv(self, *args: str, launcher: str = protocol.LAUNCHER) -> list[str]:
        """``python3 -c LAUNCHER AGENT.pyz --home H *args`` (the plan passes a placeholder
        for the launcher's source)."""
        return [self.python, "-c", launcher, self.agent_path, "--home", self.home, *args]

    def ship_agent(self) -> None:
        data, _ = agent_zip()
        r = self.transport.run([self.python, "-c", BOOTSTRAP, self.agent_path], stdin=data, timeout=120)
        if r.exit_code == 127:
            raise RemoteError(f"python3 not found in {self.name}", r,
                              hint="install it in the container: apt install python3 python3-venv")
        if not r.ok:
            raise RemoteError(f"shipping the gpujob agent to {self.name} failed", r)

    def agent(self, *args: str, stdin: Stdin = None, timeout: float | None = 120,
              on_stdout: OnData | None = None, on_stderr: OnData | None = None) -> Result:
        """Run an agent command, shipping the agent first when it is not there yet."""
        argv = self.agent_argv(*args)
        r = self.transport.run(argv, stdin=stdin, timeout=timeout, on_stdout=on_stdout, on_stderr=on_stderr)
        if r.exit_code == protocol.AGENT_MISSING:
            self.ship_agent()
            seek = getattr(stdin, "seek", None)
            if seek is not None:
                seek(0)
            r = self.transport.run(argv, stdin=stdin, timeout=timeout, on_stdout=on_stdout,
                                   on_stderr=on_stderr)
        return self._found_python(r)

    def ask(self, answer: type[_R], *args: str, stdin: Stdin = None, timeout: float | None = 120) -> _R:
        """An agent verb asked (``wire.ANSWERS`` declares each verb's answer), its answer read as
        its record: a refusal raises its mapped error (``REFUSALS``), another failure RemoteError."""
        out = self._json_of(args, self.agent(*args, stdin=stdin, timeout=timeout))
        return self.read_answer(answer, args, out)

    def read_answer(self, answer: type[_R], args, out: dict) -> _R:
        try:
            return answer.from_dict(out)
        except wire.BadShape as e:
            raise RemoteError(f"gpujob agent `{args[0]}` on {self.name} answered out of shape: {e}") from None

    def agent_begin(self, *args: str, timeout: float | None = 120):
        """An agent command sent on an exec channel that is open already, its end not
        awaited (``ask_end``); None when the transport cannot (``ask`` then)."""
        begin = getattr(self.transport, "begin", None)
        begun = begin(self.agent_argv(*args), timeout=timeout) if begin is not None else None
        return None if begun is None else AgentCall(args, timeout, *begun)

    def ask_end(self, answer: type[_R], begun, until: float | None = None) -> _R | None:
        """``ask``'s answer to what ``agent_begin`` sent; ``until`` a monotonic
        deadline (TimeoutError past it). None when the agent is not there yet: ``ask``
        ships it and asks again (a caller asking many targets does that on a thread)."""
        r = begun.channel.result(begun.pending, until=until)
        if r.exit_code == protocol.AGENT_MISSING:
            return None
        args = begun.args
        return self.read_answer(answer, args, self._json_of(args, self._found_python(r)))

    def _found_python(self, r: Result) -> Result:
        if r.exit_code == 127:
            raise RemoteError(f"python3 not found in {self.name}", r,
                              hint="install it in the container: apt install python3 python3-venv")
        return r

    def _json_of(self, args, r: Result) -> dict:
        try:
            out = json.loads(r.stdout.decode().strip().splitlines()[-1])
        except (ValueError, IndexError):
            raise RemoteError(f"gpujob agent `{args[0]}` on {self.name} failed", r) from None
        if not isinstance(out, dict):
            raise RemoteError(f"gpujob agent `{args[0]}` on {self.name} answered no JSON object", r)
        if r.exit_code == protocol.REFUSED:
            raise refusal_error(out)
        if not r.ok or "error" in out:
            e = RemoteError(f"gpujob agent `{args[0]}` on {self.name}: {out.get('error', 'failed')}")
            e.answered = True  # the agent ran to its end and said why: a submit started nothing
            raise e
        return out

    def probe(self, workdir: str | None = None) -> wire.ProbeAnswer:
        if self._probe is None:
            self._probe = self.ask(wire.ProbeAnswer, "probe", *(["--workdir", workdir] if workdir else []))
        return self._probe

    def ensure_uv(self) -> str | None:
        """The uv the container will use: its own, or ours shipped there when our
        binary can run there (same OS and CPU); None means pip (with a warning)."""
        info = self.probe()
        if info.uv:
            return info.uv
        ours = uv_binary()
        if ours is None:
            return None
        if not self.driver.ships_uv:
            return str(ours)
        if info.system != platform.system() or info.machine != platform.machine():
            return None
        dest = f"{self.home}/bin/uv"
        with open(ours, "rb") as f:
            self.ask(wire.PutAnswer, "put", dest, "--mode", "755", stdin=f, timeout=600)
        self._probe = None
        return dest

    def run(self, argv: Sequence[str], **kw) -> Result:
        return self.transport.run(argv, **kw)


class Targets:
    """Opens targets from the inventory; one connection per host (its kind's ``connect``), reused."""

    def __init__(self, inventory: Inventory, *, accept_new: bool = False, kept: bool = False):
        self.inventory = inventory
        self.accept_new = accept_new
        self.kept = kept and not accept_new  # commands go over the kept connection (gpujob/conn)
        self._hosts: dict[str, Transport] = {}
        self._lock = threading.Lock()

    def host_transport(self, host_name: str) -> Transport:
        with self._lock:  # `hosts` and `ps` open targets from several threads
            if host_name not in self._hosts:
                host = self.inventory.hosts[host_name]
                link = kinds.get(host.kind).connect(host_name, host, accept_new=self.accept_new)
                if link is None:
                    raise InputError(f"host '{host_name}' is {host.kind}; no connection runs below its "
                                     f"containers")
                self._hosts[host_name] = link
            return self._hosts[host_name]

    def open(self, target: str) -> Target:
        host_name, host, cname, container = self.inventory.resolve(target)
        o = kinds.get(host.kind).open(lambda: self.host_transport(host_name), host, cname, container)
        transport = o.transport
        if self.kept and kinds.get(host.kind).kept_connection and self.inventory.source != "embedded default":
            from gpujob.conn.remote import KeptTransport  # its commands over the kept connection
            transport = KeptTransport(o.transport, str(Path(self.inventory.source).resolve()),
                                      f"{host_name}/{cname}")
        return Target(cname, host_name, host.kind, transport, o.host_transport, o.home, o.python,
                      vmid=o.vmid, expected_gpus=container.gpus,
                      address=container.address or kinds.get(host.kind).default_address,
                      env_passthrough=host.env_passthrough + container.env_passthrough)

    def close(self) -> None:
        for t in self._hosts.values():
            t.close()
        self._hosts.clear()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

