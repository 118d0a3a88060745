"""Transports: run argv in a place. ``local``, ``ssh``, and ``pct`` stacked over another
(stacked.py: a place entered through another transport)."""

from gpujob.transport.base import Result, Transport

__all__ = ["Result", "Transport"]
