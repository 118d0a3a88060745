"""The kept connection (like OpenSSH's ControlPersist): a per-user daemon holding
SSH connections and exec channels, and a thin client that reaches it over a Unix
socket without importing typer, rich, paramiko or pydantic.

Stdlib-only modules (imported by the thin client): ``paths``, ``proto``, ``client``,
``entry``. The daemon (``server``, ``commands``) imports the full controller.
"""
