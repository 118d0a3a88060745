"""Asking several targets at once (``gpujob ps``), every answer awaited until one common
deadline. A target that has not answered by then is given up on and comes back as
``NoAnswer``; the others are not held by it. The answers are keyed by target, so what
is printed keeps the caller's order.

Two ways, one call: a target whose question can be sent without waiting (``begin``: its
exec channel is open already, as in the kept connection's daemon) is sent it from this
thread, all of them first, and their answers are then collected as they come (``end``),
with no thread a target; the others get a thread each (at most ``workers`` at a time),
whose ``fetch`` may open a connection first. A target given up on at the deadline is
cancelled (``cancel(key)``: its connection closed, so its thread's read ends and the thread
with it; a question begun on an exec channel is cancelled there) instead of being left
running after the command printed its table; the thread is a daemon thread besides, so the
CLI's exit never waits for it."""

from __future__ import annotations

import threading
import time


class NoAnswer(Exception):
    """A target that did not answer within the deadline."""


#: what ``end`` returns for a target that must be asked the slow way after all (its agent
#: is not there yet, say: shipping it is a ``fetch``, on a thread of its own)
FETCH = object()


def gather(keys: list, fetch, *, workers: int, deadline: float, begin=None, end=None, cancel=None) -> dict:
    """{key: its answer, or the exception it raised, or NoAnswer}. ``fetch(key)`` asks
    one target and waits; ``begin(key)`` sends the question and returns a handle (None:
    ``fetch`` it instead), ``end(key, handle, until)`` its answer, raising TimeoutError
    past ``until`` (a ``time.monotonic()``), or FETCH: ``fetch`` it after all. ``cancel(key)``
    ends a ``fetch`` still running at the deadline (it closes what that fetch reads from)."""
    until = time.monotonic() + deadline
    results: dict = {}
    begun: dict = {}
    rest = list(keys)
    if begin is not None:
        rest = []
        for key in keys:
            try:
                handle = begin(key)
            except Exception as e:  # noqa: BLE001 - handed to the caller, who decides
                results[key] = e
                continue
            if handle is None:
                rest.append(key)
            else:
                begun[key] = handle
    cond = threading.Condition()
    slots = threading.Semaphore(max(1, workers))
    threaded: dict = {}

    def one(key) -> None:
        with slots:
            try:
                res = fetch(key)
            except BaseException as e:  # noqa: BLE001 - handed to the caller, who decides
                res = e
        with cond:
            threaded[key] = res
            cond.notify_all()

    def ask(key) -> None:
        threading.Thread(target=one, args=(key,), daemon=True, name=f"gpujob-ask-{key}").start()

    for key in rest:
        ask(key)
    pending = list(begun)
    try:
        while pending:
            key = pending.pop(0)
            try:
                res = end(key, begun[key], until)
                if res is FETCH:
                    rest.append(key)
                    ask(key)
                else:
                    results[key] = res
            except TimeoutError:
                results[key] = NoAnswer(f"no answer within {deadline:g}s")
                _quietly(getattr(begun[key], "cancel", None))  # the question ends on its channel too
            except Exception as e:  # noqa: BLE001
                results[key] = e
    except BaseException:  # Ctrl-C: the questions not awaited yet end there too
        for key in pending:
            cancel = getattr(begun[key], "cancel", None)
            if cancel is not None:
                cancel()
        raise
    with cond:
        while len(threaded) < len(rest):
            left = until - time.monotonic()
            if left <= 0:
                break
            cond.wait(left)
        results.update(threaded)
        given_up = [k for k in rest if k not in threaded]
    if cancel is not None and given_up:  # its thread ends once what it reads from is closed; a close
        # that waits on the stuck thread's lock (a connection being opened) never holds the command
        def cancel_all() -> None:
            for k in given_up:
                _quietly(lambda: cancel(k))
        threading.Thread(target=cancel_all, daemon=True, name="gpujob-cancel").start()
    return {k: results[k] if k in results else NoAnswer(f"no answer within {deadline:g}s") for k in keys}


def _quietly(call) -> None:
    """A cancel: what it may raise (a connection closed twice) changes nothing now."""
    if call is None:
        return
    try:
        call()
    except Exception:  # noqa: BLE001 - given up on already; nothing to tell
        pass
