"""Asking several targets at once (``gpujob ps``): one thread per target, at most
``workers`` at a time, every answer awaited until one common deadline. A target that
has not answered by then is given up on (its thread is a daemon thread, so the CLI's
exit does not wait for it) and comes back as ``NoAnswer``; the others are not held by it.
The answers are keyed by target, so what is printed keeps the caller's order."""

from __future__ import annotations

import threading
import time


class NoAnswer(Exception):
    """A target that did not answer within the deadline."""


def gather(keys: list, fetch, *, workers: int, deadline: float) -> dict:
    """{key: fetch(key)'s result, or the exception it raised, or NoAnswer}."""
    results: dict = {}
    cond = threading.Condition()
    slots = threading.Semaphore(max(1, workers))

    def one(key) -> None:
        with slots:
            try:
                res = fetch(key)
            except BaseException as e:  # noqa: BLE001 - handed to the caller, who decides
                res = e
        with cond:
            results[key] = res
            cond.notify_all()

    for key in keys:
        threading.Thread(target=one, args=(key,), daemon=True, name=f"gpujob-ask-{key}").start()
    end = time.monotonic() + deadline
    with cond:
        while len(results) < len(keys):
            left = end - time.monotonic()
            if left <= 0:
                break
            cond.wait(left)
        return {k: results[k] if k in results else NoAnswer(f"no answer within {deadline:g}s") for k in keys}
