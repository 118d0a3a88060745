"""``python -m gpujob.daemon serve`` (what the first command starts, detached) and
``python -m gpujob.daemon stop`` (as ``gpujob disconnect``)."""

import sys

if __name__ == "__main__":
    what = sys.argv[1:] or ["serve"]
    if what == ["serve"]:
        from gpujob.daemon.server import serve
        sys.exit(serve())
    if what == ["stop"]:
        from gpujob.conn.client import disconnect
        sys.exit(0 if disconnect() else 1)
    sys.exit("usage: python -m gpujob.daemon serve|stop")
