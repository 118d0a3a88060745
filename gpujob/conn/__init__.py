"""The kept connection's low floor (like OpenSSH's ControlPersist): the thin client
that reaches a per-environment daemon over a Unix socket without importing typer,
rich, paramiko or pydantic, and its wire.

Stdlib-only (the console entry, gpujob/entry.py, imports them): ``paths`` (where a
daemon lives, what it must agree on), ``proto`` (the frames), ``client``. ``remote``
is the full CLI's ``KeptTransport`` over the same wire. The daemon itself, which
imports the whole controller and the CLI's command bodies, is gpujob/daemon/.
"""
