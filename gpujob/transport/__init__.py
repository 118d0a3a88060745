"""Transports: run argv in a place. ``local``, ``ssh``, and ``pct`` wrapping another."""

from gpujob.transport.base import Result, Transport

__all__ = ["Result", "Transport"]
