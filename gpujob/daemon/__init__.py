"""The kept connection's daemon, a top floor of its own above the CLI: it holds one
``Targets`` per inventory (``pool``) and serves the thin client's requests over a
Unix socket (``server``: ``exec`` and ``status`` through the CLI's own command
bodies, gpujob/ops/bodies.py, so both print the same bytes; ``relay``: one command
for the full CLI's ``KeptTransport``). Started detached as ``python -m gpujob.daemon
serve`` by the first command that finds none (gpujob/conn/client.py).
"""
