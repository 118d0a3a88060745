"""One persistent SSH connection to a host; every command is a channel on it.

Plain paramiko (no fabric): we need the channel itself for unbuffered stdout and
stderr, stdin streaming, a host-key policy of our own and exact argv quoting;
fabric/invoke's runner adds threads and PTY handling we would have to switch off.

Quoting: the remote sshd runs the command string with the login shell, so the
argv is joined with :func:`shlex.join` here, once, and nowhere else.
"""

from __future__ import annotations

import base64
import hashlib
import logging
import select
import shlex
import socket
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

from gpujob import lazyimport
from gpujob.transport import identities

if TYPE_CHECKING:  # the checker reads paramiko's stubs; at run time it is the same module, loaded below
    import paramiko
else:
    paramiko = lazyimport.paramiko()  # its invoke (Match exec only) loads when used


from gpujob.errors import ConnectError, ConnectionLost, HostKeyError
from gpujob.transport.base import (KILL_AFTER, TIMEOUT_EXIT, OnData, Result, Stdin, Transport,
                                   iter_chunks, keep, timed_out_by, with_timeout)

#: what SshStream.stderr keeps of a stream's stderr (read when the stream failed, to say why)
MAX_STDERR = 64 << 10

# paramiko logs failed handshakes with a traceback; our errors say it in one line
logging.getLogger("paramiko").addHandler(logging.NullHandler())
logging.getLogger("paramiko").propagate = False


def fingerprint(key: paramiko.PKey) -> str:
    """OpenSSH's ``SHA256:…`` fingerprint of a host key."""
    digest = hashlib.sha256(key.asbytes()).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


def known_hosts_name(hostname: str, port: int) -> str:
    return hostname if port == 22 else f"[{hostname}]:{port}"


class _HostKeyPolicy(paramiko.MissingHostKeyPolicy):
    """Unknown key: refuse with its fingerprint, or record it when accept_new (like
    OpenSSH's StrictHostKeyChecking=accept-new). A changed key never reaches this
    policy: paramiko raises BadHostKeyException, which we always refuse."""

    def __init__(self, known_hosts: Path, accept_new: bool, revoked: frozenset = frozenset()):
        self.known_hosts = known_hosts
        self.accept_new = accept_new
        self.revoked = revoked

    def missing_host_key(self, client, hostname, key):
        fp = fingerprint(key)
        if key.get_base64() in self.revoked:
            raise HostKeyError(f"host key of {hostname} ({key.get_name()} {fp}) is marked @revoked in "
                               f"{self.known_hosts}; refused before authentication, nothing was run")
        if not self.accept_new:
            raise HostKeyError(
                f"host key of {hostname} is not known ({key.get_name()} {fp}); nothing was run",
                hint=f"check that fingerprint on the host (ssh-keygen -lf /etc/ssh/ssh_host_*_key.pub), "
                     f"then rerun with --accept-new to add it to {self.known_hosts}")
        self.known_hosts.parent.mkdir(parents=True, exist_ok=True)
        with open(self.known_hosts, "a") as f:
            f.write(f"{hostname} {key.get_name()} {key.get_base64()}\n")
        client.get_host_keys().add(hostname, key.get_name(), key)


def load_known_hosts(client: paramiko.SSHClient, path: Path) -> frozenset:
    """Load OpenSSH's known_hosts into ``client``, line by line, and return the keys
    marked ``@revoked`` (refused whoever offers them). ``@cert-authority`` lines are
    skipped (paramiko checks no host certificates); a line that cannot be read is a
    one-line HostKeyError naming it, never a paramiko traceback."""
    try:
        text = path.read_bytes().decode("utf-8")
    except OSError as e:
        raise HostKeyError(f"cannot read known_hosts file {path}: {e.strerror or e}") from None
    except UnicodeDecodeError:
        raise HostKeyError(f"known_hosts file {path} is not UTF-8 text") from None
    revoked, plain = set(), []
    keys = client.get_host_keys()
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("@"):
            parts = line.split()
            if parts[0] == "@revoked" and len(parts) >= 4:
                revoked.add(parts[3])
            elif parts[0] not in ("@revoked", "@cert-authority") or len(parts) < 4:
                raise HostKeyError(f"known_hosts file {path}:{number}: unknown marker or short line "
                                   f"{parts[0][:40]!r}")
            continue
        try:
            entry = paramiko.hostkeys.HostKeyEntry.from_line(line, number)
        except Exception as e:  # paramiko raises InvalidHostKey, binascii.Error, ValueError, ...
            raise HostKeyError(f"known_hosts file {path}:{number}: cannot read this line "
                               f"({type(e).__name__})") from None
        if entry is not None and entry.key is not None:
            if not all(_hashed_ok(name) for name in entry.hostnames if name.startswith("|")):
                raise HostKeyError(f"known_hosts file {path}:{number}: a hashed host name that is not "
                                   "|1|salt|hash (20 bytes each, base64)")
            plain.append(entry)
    # a revoked key is known nowhere, whatever other line names it (the @revoked line may
    # come after): paramiko then asks _HostKeyPolicy, which refuses it during the key
    # exchange, before any authentication
    for entry in plain:
        if entry.key.get_base64() not in revoked:
            for name in entry.hostnames:
                keys.add(name, entry.key.get_name(), entry.key)
    return frozenset(revoked)


def _hashed_ok(name: str) -> bool:
    """OpenSSH's hashed host name, |1|base64(salt)|base64(hash): paramiko asserts on bad ones."""
    parts = name.split("|")
    try:
        return len(parts) == 4 and parts[1] == "1" and all(
            len(base64.b64decode(part, validate=True)) == 20 for part in parts[2:])
    except ValueError:
        return False


def _tcp_keepalive(sock: socket.socket, idle: int) -> None:
    """Notice a silently dead peer (laptop Wi-Fi) without waiting for TCP's hours."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for opt, val in (("TCP_KEEPIDLE", idle), ("TCP_KEEPINTVL", 5), ("TCP_KEEPCNT", 3)):
        if hasattr(socket, opt):
            sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, opt), val)


def _hint_for(e: Exception) -> str | None:
    """What usually causes an SSH failure paramiko words tersely."""
    if "protocol banner" in str(e):
        return ("the port answered but not with SSH: usually the wrong port (another service "
                "listens there), a firewall or proxy that accepts and then drops the connection, or "
                "an sshd too busy to answer in time (MaxStartups; a slow reverse DNS lookup, UseDNS): "
                "try `ssh -v -p PORT user@host`, or raise connect_timeout in hosts.yaml")
    return None


def _no_key_where(settings) -> str:
    """Where a key was looked for, when none was found (paramiko says only 'No authentication
    methods available')."""
    named = [str(k) for k in settings.identity_files]
    files = f"no file at {', '.join(named)}" if named else "no identity_file in hosts.yaml or ~/.ssh/config"
    if getattr(settings, "identities_only", False):
        return f"{files} (IdentitiesOnly yes: no other key is offered)"
    return f"{files}, no ~/.ssh/id_* key, and no key in an ssh-agent"


def _link(client: paramiko.SSHClient, where: str) -> paramiko.Transport:
    """The client's transport; ConnectionLost when it has none (closed meanwhile)."""
    transport = client.get_transport()
    if transport is None:
        raise ConnectionLost(f"lost the connection to {where}")
    return transport


def connect(settings, *, accept_new: bool = False, sock=None) -> paramiko.SSHClient:
    """Open an authenticated SSH connection; raise a one-line ConnectError on failure.

    ``settings`` is an :class:`gpujob.transport.ssh_config.SshSettings` (hostname, port, user,
    identity_files, known_hosts, jump, connect_timeout, keepalive).
    """
    where = f"{settings.user}@{settings.hostname}:{settings.port}"
    jump_client = None
    if sock is None and settings.jump is not None:
        jump_client = connect(settings.jump, accept_new=accept_new)
        try:
            sock = _link(jump_client, settings.jump.hostname).open_channel(
                "direct-tcpip", (settings.hostname, settings.port), ("127.0.0.1", 0),
                timeout=settings.connect_timeout)
        except (paramiko.SSHException, OSError) as e:
            jump_client.close()
            raise ConnectError(f"cannot reach {where} through jump host "
                               f"{settings.jump.hostname}: {e}") from None
    if sock is None:
        try:
            sock = socket.create_connection((settings.hostname, settings.port),
                                            timeout=settings.connect_timeout)
        except socket.gaierror as e:
            raise ConnectError(f"cannot resolve host '{settings.hostname}' (DNS): {e.strerror}",
                               hint="check `address` in hosts.yaml or HostName in ~/.ssh/config") from None
        except ConnectionRefusedError:
            raise ConnectError(f"connection refused by {settings.hostname}:{settings.port}",
                               hint="is sshd running there, and is the port right?") from None
        except (socket.timeout, TimeoutError):
            raise ConnectError(f"timed out after {settings.connect_timeout:g}s connecting to "
                               f"{settings.hostname}:{settings.port}") from None
        except OSError as e:
            raise ConnectError(f"cannot connect to {settings.hostname}:{settings.port}: "
                               f"{e.strerror or e}") from None
        if settings.keepalive > 0:
            _tcp_keepalive(sock, int(max(settings.keepalive, 1)))
        # every command is a few small packets (channel open, exec, EOF): without this, Nagle
        # holds each behind the server's delayed ACK, ~40 ms a command (OpenSSH sets it too)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    client = paramiko.SSHClient()
    known = Path(settings.known_hosts).expanduser()
    revoked: frozenset[str] = frozenset()
    if known.exists():
        try:
            revoked = load_known_hosts(client, known)
        except HostKeyError:
            sock.close()
            raise
    client.set_missing_host_key_policy(_HostKeyPolicy(known, accept_new, revoked))
    keys = [str(Path(k).expanduser()) for k in settings.identity_files
            if Path(k).expanduser().exists()]
    only = getattr(settings, "identities_only", False)
    agent = identities.AgentKeys(keys if only and getattr(settings, "allow_agent", True) else [])
    try:
        client.connect(
            settings.hostname, port=settings.port, username=settings.user, sock=sock,
            # IdentitiesOnly: the agent signs only for a configured identity (its first match)
            pkey=agent.keys[0] if agent.keys else None,
            key_filename=keys or None,  # type: ignore[arg-type]  # paramiko takes a list of files too
            timeout=settings.connect_timeout,
            banner_timeout=settings.connect_timeout, auth_timeout=settings.connect_timeout,
            allow_agent=getattr(settings, "allow_agent", True) and not only,
            look_for_keys=not keys and not only)
    except HostKeyError:
        client.close()
        raise
    except paramiko.BadHostKeyException as e:
        client.close()
        name = known_hosts_name(settings.hostname, settings.port)
        if e.key.get_base64() in revoked:
            raise HostKeyError(f"host key of {name} ({e.key.get_name()} {fingerprint(e.key)}) is marked "
                               f"@revoked in {known}; refused before authentication, "
                               "nothing was run") from None
        raise HostKeyError(
            f"host key of {name} has CHANGED: known_hosts has {fingerprint(e.expected_key)}, "
            f"the server offered {e.key.get_name()} {fingerprint(e.key)}; refused, nothing was run",
            hint="if the host was reinstalled, remove the old key: "
                 f"ssh-keygen -R '{name}' -f {known}") from None
    except paramiko.AuthenticationException:
        client.close()
        tried = ", ".join(keys) if keys else "default keys"
        if only:
            tried += ", IdentitiesOnly yes: no other key of an ssh-agent"
        elif getattr(settings, "allow_agent", True):
            tried += " and ssh-agent"
        raise ConnectError(f"authentication failed for {where} (tried {tried})",
                           hint="check `user` and `identity_file` in hosts.yaml") from None
    except (paramiko.SSHException, OSError, EOFError) as e:
        client.close()
        if "No authentication methods available" in str(e):  # no key file, none in ~/.ssh, no agent
            raise ConnectError(
                f"no SSH key to log in to {where} with: {_no_key_where(settings)}",
                hint=f"make a key and install it on the host (README step 1): ssh-keygen -t ed25519, then "
                     f"ssh-copy-id -p {settings.port} {settings.user}@{settings.hostname}; or name one with "
                     "`identity_file` in hosts.yaml") from None
        raise ConnectError(f"ssh to {where} failed: {e or type(e).__name__}", hint=_hint_for(e)) from None
    finally:
        agent.close()  # its keys sign only during the login
    offered = _link(client, where).get_remote_server_key()
    if offered.get_base64() in revoked:
        client.close()
        raise HostKeyError(f"host key of {known_hosts_name(settings.hostname, settings.port)} "
                           f"({offered.get_name()} {fingerprint(offered)}) is marked @revoked in {known}; "
                           "refused, nothing was run")
    if settings.keepalive > 0:  # 0 turns keepalives off
        _link(client, where).set_keepalive(int(max(settings.keepalive, 1)))
    if jump_client is not None:
        client._gpujob_jump = jump_client  # type: ignore[attr-defined]  # alive as long as this client
    return client


class SshTransport(Transport):
    """A lazily opened, persistent SSH connection; thread-safe to share."""

    def __init__(self, settings, *, accept_new: bool = False):
        self.settings = settings
        self.accept_new = accept_new
        self._client: paramiko.SSHClient | None = None
        self._lock = threading.Lock()
        self._closed_while_connecting = False

    def describe(self) -> str:
        s = self.settings
        return f"{s.user}@{s.hostname}:{s.port}"

    def client(self) -> paramiko.SSHClient:
        with self._lock:
            transport = self._client.get_transport() if self._client is not None else None
            if self._client is None or transport is None or not transport.is_active():
                self._close_locked()
                self._closed_while_connecting = False
                self._client = connect(self.settings, accept_new=self.accept_new)
                if self._closed_while_connecting:  # closed meanwhile (close did not wait): not kept
                    self._close_locked()
                    raise ConnectError(f"the connection to {self.describe()} was closed while it was opened")
            return self._client

    def host_key(self) -> str:
        """The host's key as ``type SHA256:…`` (connecting first when needed)."""
        key = _link(self.client(), self.describe()).get_remote_server_key()
        return f"{key.get_name()} {fingerprint(key)}"

    def reconnect(self) -> None:
        with self._lock:
            self._close_locked()
        self.client()

    def _close_locked(self) -> None:
        if self._client is not None:
            jump = getattr(self._client, "_gpujob_jump", None)
            self._client.close()
            if jump is not None:
                jump.close()
            self._client = None

    def close(self) -> None:
        """Close the connection. One being opened by another thread (a host that ``ps``
        gave up on) is not waited for: it is closed as soon as it is open."""
        if not self._lock.acquire(timeout=0.5):
            self._closed_while_connecting = True
            return
        try:
            self._close_locked()
        finally:
            self._lock.release()

    def run(self, argv: Sequence[str], *, stdin: Stdin = None, timeout: float | None = None,
            on_stdout: OnData | None = None, on_stderr: OnData | None = None) -> Result:
        argv = list(argv)
        started = time.monotonic()
        transport = _link(self.client(), self.describe())
        try:
            chan = transport.open_session(timeout=self.settings.connect_timeout)
            chan.exec_command(shlex.join(with_timeout(argv, timeout)))
        except (paramiko.SSHException, OSError, EOFError) as e:
            raise ConnectionLost(f"lost the connection to {self.describe()}: {e}") from None
        # the far side ends the command at `timeout`; this deadline is only the backstop
        backstop = None if timeout is None else started + timeout + KILL_AFTER + 15
        feeder = None
        if stdin is None:
            chan.shutdown_write()
        else:
            feeder = threading.Thread(target=self._feed, args=(chan, stdin), daemon=True)
            feeder.start()
        out, err = bytearray(), bytearray()
        try:
            while True:
                select.select([chan], [], [], 0.5)
                got = self._drain(chan, on_stdout, on_stderr, out, err, argv)
                if chan.exit_status_ready() and not got and chan.eof_received:
                    break
                if chan.closed and not got:
                    break
                if not transport.is_active():
                    raise ConnectionLost(f"lost the connection to {self.describe()}")
                if backstop is not None and time.monotonic() > backstop:
                    chan.close()
                    return Result(argv, TIMEOUT_EXIT, bytes(out), bytes(err), True,
                                  time.monotonic() - started)
        except BaseException:
            chan.close()
            raise
        try:
            self._drain(chan, on_stdout, on_stderr, out, err, argv)
        except BaseException:
            chan.close()
            raise
        # paramiko reports -1 when no exit-status message came: either the link
        # died (a dropped connection) or sshd saw the command die of a signal
        code = chan.recv_exit_status() if chan.exit_status_ready() else -1
        chan.close()
        if code < 0:
            if not transport.is_active():
                raise ConnectionLost(f"lost the connection to {self.describe()} while running {argv[0]}")
            code = 255
        elapsed = time.monotonic() - started
        timed_out = timed_out_by(timeout, elapsed, code)
        return Result(argv, TIMEOUT_EXIT if timed_out else code, bytes(out), bytes(err), timed_out,
                      elapsed)

    def open_stream(self, argv: Sequence[str]) -> "SshStream":
        """Start ``argv`` on a channel of its own and hand back its raw byte stream."""
        try:
            chan = _link(self.client(), self.describe()).open_session(timeout=self.settings.connect_timeout)
            chan.exec_command(shlex.join(argv))
        except (paramiko.SSHException, OSError, EOFError) as e:
            raise ConnectionLost(f"lost the connection to {self.describe()}: {e}") from None
        return SshStream(chan)

    def _drain(self, chan, on_stdout, on_stderr, out: bytearray, err: bytearray, argv) -> bool:
        """Hand on whatever stdout and stderr data has arrived; True when there was some.
        A captured stream past MAX_ANSWER is HostMisbehaving (the caller closes the channel)."""
        got = False
        for ready, recv, cb, buf in ((chan.recv_ready, chan.recv, on_stdout, out),
                                     (chan.recv_stderr_ready, chan.recv_stderr, on_stderr, err)):
            while ready():
                chunk = recv(65536)
                if not chunk:
                    break
                got = True
                if cb is not None:
                    cb(chunk)
                else:
                    keep(buf, chunk, self.describe(), argv)
        return got

    @staticmethod
    def _feed(chan, stdin: Stdin) -> None:
        try:
            for chunk in iter_chunks(stdin):
                chan.sendall(chunk)
            chan.shutdown_write()
        except (OSError, paramiko.SSHException, EOFError):
            pass


class SshStream:
    """A channel as a plain byte stream: stdin in, stdout out (stderr kept for errors)."""

    def __init__(self, chan):
        self.chan = chan

    def send(self, data: bytes) -> None:
        try:
            self.chan.sendall(data)
        except (paramiko.SSHException, socket.error) as e:
            raise OSError(str(e)) from None

    def recv(self, n: int) -> bytes:
        try:
            return self.chan.recv(n)
        except (paramiko.SSHException, socket.error):
            return b""

    def stderr(self) -> bytes:
        out = b""
        while self.chan.recv_stderr_ready() and len(out) < MAX_STDERR:
            out += self.chan.recv_stderr(65536)
        return out[:MAX_STDERR]

    def close(self) -> None:
        self.chan.close()
