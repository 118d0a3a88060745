"""The inventory (hosts.yaml): Proxmox hosts reached over SSH, or this machine,
and the containers on them that run jobs."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

from pydantic import BeforeValidator, Field, PrivateAttr, StringConstraints, model_validator

from gpujob import kinds
from gpujob.inventory import names as invnames
from gpujob.errors import InputError
from gpujob.spec.types import PathText
from gpujob.yamlsrc import At, Strict, describe, load_yaml

DEFAULT_INVENTORY = {
    "hosts": {"local": {"kind": "local", "containers": {"demo": {"root": "~/.local/share/gpujob/demo"}}}},
}

#: the built-in target's names, reachable beside a user's inventory (Inventory.resolve)
BUILTIN_NAMES = ("demo", "local/demo")


def _vmid(value):
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"expected an integer VMID, got {describe(value)}")
    if not 100 <= value <= 999_999_999:
        raise ValueError(f"expected a VMID between 100 and 999999999, got {value}")
    return value


Name = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")]
EnvPattern = Annotated[str, StringConstraints(pattern=r"^[A-Za-z_*?\[][A-Za-z0-9_*?\[\]!-]*$")]
Vmid = Annotated[int, BeforeValidator(_vmid)]


class Container(Strict):
    vmid: Vmid | None = None  # ssh hosts only (required there)
    gpus: int | None = Field(None, ge=0, le=1024)  # expected GPU count
    root: PathText | None = None  # local hosts only (required there): stands in for the container
    home: PathText | None = None  # ssh hosts only: gpujob's home in the container; None = ~/.gpujob
    env_passthrough: list[EnvPattern] = []  # added to the host's: variables jobs keep (globs)
    # where the other nodes of a multi-node job reach this container (its rendezvous address);
    # None: 127.0.0.1 on a local host, the container's primary IP (asked at submit) over ssh
    address: str | None = Field(None, pattern=r"^[A-Za-z0-9.:_\[\]-]{1,253}$")


def _kind(value):
    if value not in kinds.NAMES:
        raise ValueError(f"expected one of {', '.join(kinds.NAMES)}, got {describe(value)}")
    return value


Kind = Annotated[str, BeforeValidator(_kind)]
#: host fields some kind accepts and the others refuse
_KIND_ONLY = tuple(f for k in kinds.REGISTRY.values() for f in k.host_fields)
_CONTAINER_ONLY = tuple(f for k in kinds.REGISTRY.values() for f in k.container_fields)


class Host(Strict):
    kind: Kind = "ssh"  # a name in gpujob.kinds.REGISTRY
    address: PathText | None = None
    port: int | None = Field(None, ge=1, le=65535)
    user: PathText | None = None
    identity_file: PathText | None = None
    known_hosts: PathText | None = None
    proxy_jump: PathText | None = None
    pct: PathText = "pct"
    connect_timeout: float = Field(10.0, gt=0, le=3600)
    keepalive: float = Field(15.0, ge=0, le=3600)  # 0: off
    env_passthrough: list[EnvPattern] = []  # variables (glob patterns) every job here keeps
    containers: dict[Name, Container] = Field(min_length=1)

    @model_validator(mode="after")
    def _fits_kind(self) -> Host:
        kind = kinds.get(self.kind)
        if "address" in kind.host_fields and self.address is None:
            raise At(("address",), "missing (required)")
        for field in _KIND_ONLY:
            if field not in kind.host_fields and getattr(self, field) is not None:
                raise At((field,), f"only for {_who('host_fields', field)} hosts")
        for name, container in self.containers.items():
            for field in kind.container_required:
                if getattr(container, field) is None:
                    raise At(("containers", name, field), "missing (required)")
            for field in _CONTAINER_ONLY:
                if field not in kind.container_fields and getattr(container, field) is not None:
                    raise At(("containers", name, field), f"only for {_who('container_fields', field)} hosts")
        return self


def _who(attr: str, field: str) -> str:
    """The kinds that take ``field`` (``ssh``; ``ssh or docker``)."""
    return " or ".join(k.name for k in kinds.REGISTRY.values() if field in getattr(k, attr))


class Inventory(Strict):
    hosts: dict[Name, Host] = Field(min_length=1)
    _source: str = PrivateAttr("embedded default")

    @property
    def source(self) -> str:
        """The file this inventory came from, or 'embedded default'."""
        return self._source

    def targets(self) -> list[tuple[str, str]]:
        return invnames.targets(self.hosts)

    def resolve(self, target: str) -> tuple[str, Host, str, Container]:
        """`name` or `host/name` -> (host name, host, container name, container). The built-in
        `local/demo` stays reachable beside the user's hosts (`gpujob demo` after README step 2)
        unless their file has a host `local` or a container `demo` of its own."""
        try:
            return invnames.resolve(self.hosts, self._source, target, no_inventory_note)
        except InputError:
            if self._source == "embedded default" or target not in BUILTIN_NAMES or "local" in self.hosts \
                    or any(c == "demo" for _, c in self.targets()):
                raise
            return load_inventory(None).resolve(target)


def entry_of(inventory: Inventory, target: str) -> dict:
    """The part of ``inventory`` that reaches ``target``: its host with only that
    container, as a small inventory of its own, laptop paths made absolute (they
    were read from this directory). The laptop index keeps it with each job."""
    host_name, host, cname, container = inventory.resolve(target)
    data = host.model_dump(mode="json", exclude_defaults=True, exclude={"containers"})
    for key in ("identity_file", "known_hosts"):
        if data.get(key) and not data[key].startswith("~"):
            data[key] = os.path.abspath(data[key])
    c = container.model_dump(mode="json", exclude_defaults=True)
    if c.get("root") and not c["root"].startswith("~"):
        c["root"] = os.path.abspath(c["root"])
    data["containers"] = {cname: c}
    return {"hosts": {host_name: data}}


def find_inventory(explicit: str | None) -> Path | None:
    """--hosts, then $GPUJOB_HOSTS, then the user's $XDG_CONFIG_HOME/gpujob/hosts.yaml, then
    ./hosts.yaml: a folder's file (a clone's example) never shadows the user's own."""
    for given, what in ((explicit, "--hosts"), (os.environ.get("GPUJOB_HOSTS"), "$GPUJOB_HOSTS")):
        if given:
            path = Path(given).expanduser()
            if not path.is_file():
                raise InputError(f"{what}: no such file: {path}")
            return path
    for path in search_paths():
        if path.is_file():
            return path
    return None


def search_paths() -> list[Path]:
    """Where an inventory is looked for when neither --hosts nor $GPUJOB_HOSTS names one."""
    config = Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config")
    return [config / "gpujob" / "hosts.yaml", Path("hosts.yaml")]


def no_inventory_note() -> str:
    """Said when a target is not found in the built-in inventory."""
    looked = ", ".join(str(p.absolute()) if not p.is_absolute() else str(p) for p in search_paths())
    return (f"no hosts.yaml found (looked in {looked}); using the built-in inventory; "
            "give --hosts FILE or set $GPUJOB_HOSTS")


def load_inventory(path: Path | None, raw: bytes | None = None) -> Inventory:
    """The inventory in path (SpecError when invalid); None: the embedded default.
    ``raw``: path's bytes, read already (these are validated, not the file again)."""
    if path is None:
        return Inventory.model_validate(DEFAULT_INVENTORY)
    inventory = load_yaml(path, raw=raw).validate(Inventory)
    inventory._source = str(path)
    return inventory


def load_inventory_data(data: dict) -> Inventory:
    """An inventory entry this laptop recorded with a job (see entry_of)."""
    from pydantic import ValidationError
    try:
        inventory = Inventory.model_validate(data)
    except ValidationError as e:
        raise InputError(f"the inventory entry recorded with this job no longer validates "
                         f"({e.errors()[0].get('msg')}); give --hosts with its host") from None
    inventory._source = "recorded with the job"
    return inventory
