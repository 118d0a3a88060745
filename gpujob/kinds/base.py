"""The contract every target kind fulfils (see gpujob/kinds/__init__.py)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Protocol

from gpujob.agent.base.protocol import StrEnum
from gpujob.transport.base import Transport

if TYPE_CHECKING:
    from gpujob.steps import Step

class CheckStatus(StrEnum):
    """A doctor check's outcome."""
    OK = "ok"
    WARN = "warn"
    FAIL = "fail"


#: ``add(name, status, detail, hint="")``: how a kind's judge reports a check
#: (status: a CheckStatus).
AddCheck = Callable[..., None]


#: ``host()``: the connection to the host below the container, opened on the first call and
#: the same one after (gpujob.ops.target.Targets keeps one per host, made by ``Kind.connect``)
HostLink = Callable[[], Transport]


class Reached(Protocol):
    """What a kind sees of a target it opened (gpujob.ops.target.Target is one)."""
    transport: Transport             # runs argv inside the container
    host_transport: Transport | None  # runs argv on the host below it, when there is one


@dataclass
class Opened:
    """What a kind hands ``Targets.open`` to build a Target from."""
    transport: Transport            # runs argv inside the container
    host_transport: Transport | None  # runs argv on the host below it, when there is one
    home: str                       # gpujob's home inside the container (absolute)
    python: str                     # interpreter for the agent
    vmid: int | None = None


class Kind(ABC):
    #: the name hosts.yaml's ``kind:`` gives
    name: str = ""
    #: host fields only this kind accepts (hosts.yaml says 'only for <kind> hosts' elsewhere)
    host_fields: tuple[str, ...] = ()
    #: container fields only this kind accepts, and those of them it requires
    container_fields: tuple[str, ...] = ()
    container_required: tuple[str, ...] = ()
    #: may a job here install a boot hook (the container's /etc/rc.local)?
    boot_hooks: bool = False
    #: is our own uv binary shipped into the container (else it is used in place)?
    ships_uv: bool = False
    #: where other nodes of a multi-node job reach a container of this kind when hosts.yaml
    #: gives it no ``address:`` (None: ask the container for its primary IP at submit)
    default_address: str | None = None
    #: whether the kept-connection daemon (gpujob/conn) may hold this kind's connections;
    #: its known_hosts (a host field) is then watched for changes
    kept_connection: bool = False

    def reach_files(self, host_name: str, host) -> list[str]:
        """Files besides hosts.yaml that decide how the host is reached (the user's ssh
        config, what it includes, the known_hosts it names): the daemon watches them."""
        return []

    def unhonoured(self, host_name: str, host) -> list[str]:
        """One line for each setting that decides how to reach the host and that gpujob
        does not honour (said on stderr; the daemon leaves such a host to the full CLI)."""
        return []

    def connect(self, host_name: str, host, *, accept_new: bool) -> Transport | None:
        """The one connection to the host below this kind's containers (``host``: its
        hosts.yaml entry), or None when there is none."""
        return None

    @abstractmethod
    def open(self, host: HostLink, entry, cname: str, container) -> Opened:
        """The transport into the container (over ``host()`` when it has one), and where
        gpujob lives there; ``entry`` and ``container`` are hosts.yaml's."""

    def plan_connect(self, target: Reached) -> list["Step"]:
        """Plan steps before the first container command (connecting, channels)."""
        return []

    def gather(self, target: Reached, facts: dict) -> bool:
        """Add doctor facts of the layers below the container; False: stop there."""
        return True

    def judge(self, facts: dict, add: AddCheck) -> bool:
        """Judge those facts (pure); False: a layer failed and nothing above can be checked."""
        return True

    @abstractmethod
    def status(self, target: Reached) -> str:
        """The container's state in a word (``running``, ``stopped``, ``local``) or why not known."""

    def reconnect(self, target: Reached) -> None:
        """Open again what a dropped connection closed (raises ConnectError when it cannot)."""
