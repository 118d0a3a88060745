"""``python -m gpujob.daemon serve [--warm INVENTORY TARGET]`` (what the first command
starts, detached; ``--warm``: the target that command used, connected to at once; an
empty INVENTORY is the built-in one) and ``python -m gpujob.daemon stop`` (as
``gpujob disconnect``)."""

import sys

if __name__ == "__main__":
    what = sys.argv[1:] or ["serve"]
    if what == ["serve"] or (len(what) == 4 and what[:2] == ["serve", "--warm"]):
        from gpujob.daemon.server import serve
        sys.exit(serve((what[2] or None, what[3]) if len(what) == 4 else None))
    if what == ["stop"]:
        from gpujob.conn.client import disconnect
        sys.exit(0 if disconnect() else 1)
    sys.exit("usage: python -m gpujob.daemon serve [--warm INVENTORY TARGET] | stop")
