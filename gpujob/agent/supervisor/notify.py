"""Webhook notifications sent by the supervisor in the container (stdlib only): the
laptop may be off when a job rolls back or fails.

Each message is written first to the job's outbox (``notify/<id>.json`` in the job
dir), then each webhook's own sender thread posts it (one thread and one bounded queue
per webhook, so a slow or broken one delays no other), with retries and backoff; the
watch loop never waits on the network. Each attempt is over within the webhook's
``timeout`` all told (agent/supervisor/webhook.py: a watchdog shuts its socket), and a
message is tried for at most the webhook's ``deadline``: then it is given up, whatever
retries are left. Every failed attempt, whatever its cause, counts against ``retries``;
an attempt is written down before it starts, so one cut by a death counts too. A queue
that is full (``QUEUE_CAP`` messages) drops its oldest message, counted and reported.

An acknowledgement (HTTP 2xx) is written down before anything else, so a supervisor
killed mid-send re-sends only what was not acknowledged (at least once: each message
carries its id, ``X-Gpujob-Event-Id`` and ``id`` in the JSON body, for receivers to
drop a repeat) and never what was. A message no webhook waits for any more (taken, out
of retries, past its deadline, dropped) becomes ``<id>.done``. A failed attempt is an
event in the journal (``notify_error``, the webhook named by its index, never its URL),
never a job failure. The supervisor waits for its senders at its end for at most the
largest deadline of its webhooks (``Notifier.close``).

Webhook URLs and tokens given as secrets live in the job's 0600 ``secrets.json``
under ``notify``; they stay there after the job ends only until the outbox is empty.
"""

from __future__ import annotations

import os
import threading
import time

from gpujob.agent.base.defaults import DEFAULTS
from gpujob.agent.base.planshare import MASK
from gpujob.agent.base.fsio import now, read_json, write_json
from gpujob.agent.supervisor.notifytext import EVENTS, backoff, message, render
from gpujob.agent.supervisor.webhook import post

__all__ = ["EVENTS", "OUTBOX", "Notifier", "backoff", "message", "outbox_summary", "post", "render",
           "waiting"]

OUTBOX = "notify"
QUEUE_CAP = 100  # messages waiting per webhook; a full queue drops its oldest (counted, reported)
CLOSE_GRACE = 2.0  # past the deadline, at the supervisor's end: for a sender to write its last attempt down

# ---- the outbox ---------------------------------------------------------------------

def waiting(job_dir: str) -> bool:
    """Messages in the job's outbox that some webhook has not taken yet."""
    try:
        return any(n.endswith(".json") for n in os.listdir(os.path.join(job_dir, OUTBOX)))
    except OSError:
        return False


def outbox_summary(job_dir: str) -> dict | None:
    """How the job's messages stand (for status): waiting, taken by every webhook,
    given up by some, dropped from a full queue (per webhook); None when the job has no outbox."""
    try:
        names = os.listdir(os.path.join(job_dir, OUTBOX))
    except OSError:
        return None
    recs = {n: read_json(os.path.join(job_dir, OUTBOX, n)) or {} for n in names
            if n.endswith((".json", ".done"))}
    done = [r for n, r in recs.items() if n.endswith(".done")]
    return {"waiting": sum(n.endswith(".json") for n in names),
            "sent": sum(1 for r in done if not r.get("failed")),
            "given_up": sorted((r.get("message") or {}).get("id", "?") for r in done if r.get("failed")),
            "dropped": sum(len(r.get("dropped") or []) for r in recs.values())}


# ---- the senders: one per webhook ----------------------------------------------------

class _Sender:
    """One webhook's queue (message ids, oldest first) and the times of each: its next
    attempt and its deadline (monotonic). Guarded by the Notifier's lock."""

    def __init__(self, index: int, hook: dict):
        self.index = index
        self.timeout, self.retries = float(hook["timeout"]), int(hook["retries"])
        self.deadline = float(hook["deadline"])
        self.queue: list = []
        self.due: dict = {}
        self.ends: dict = {}
        self.inflight: str | None = None
        self.dropped = 0


class Notifier:
    """One job's outbox and the threads that drain it, one per webhook. ``emit`` (any
    thread) writes a message down and queues it for the webhooks that take it; ``close``
    waits until the outbox is drained or the deadlines have passed."""

    def __init__(self, journal, job: dict, secrets_path: str):
        self.journal = journal
        self.job = job
        self.hooks = [{**DEFAULTS["notify"], **h} for h in job.get("spec", {}).get("notify") or []]
        self.dir = journal.path(OUTBOX)
        self.secrets_path = secrets_path
        self._secrets: dict | None = None
        self._cond = threading.Condition(threading.RLock())  # the records and the queues
        self._senders = [_Sender(i, h) for i, h in enumerate(self.hooks)]
        self._recs: dict = {}  # message id -> [path, record]
        self._started = self._closed = False

    def deadline(self) -> float:
        """Seconds the supervisor may wait for its webhooks at its end (the largest deadline)."""
        return max((s.deadline for s in self._senders), default=0.0)

    # -- writing messages down --
    def wants(self, kind: str) -> bool:
        """Whether ``emit(kind, ...)`` would write a message down (a webhook takes it)."""
        return any(kind in h["events"] for h in self.hooks)

    def emit(self, kind: str, key: str, **fields) -> str | None:
        """Write down the ``kind`` message (``key`` makes its id: the same event
        emitted again after a death is the same message, kept once). Returns its id.
        A message that cannot be written down is an event, never the job's end."""
        try:
            return self._emit(kind, key, **fields)
        except Exception as e:
            try:
                self.journal.event("notify_error",
                                   error=f"cannot queue the {kind} message: {type(e).__name__}: {e}")
            except Exception:
                pass
            return None

    def _emit(self, kind: str, key: str, **fields) -> str | None:
        targets = [i for i, h in enumerate(self.hooks) if kind in h["events"]]
        if not targets:
            return None
        job_id = self.journal.job_id
        event_id = f"{job_id}.{kind}.{key}"
        path = os.path.join(self.dir, event_id + ".json")
        with self._cond:
            if os.path.exists(path) or os.path.exists(os.path.join(self.dir, event_id + ".done")):
                return event_id
            os.makedirs(self.dir, exist_ok=True)
            msg = message(kind, event_id, job_id, self.job.get("spec", {}).get("name", ""), now(), **fields)
            rec = {"message": msg, "pending": targets, "acked": [], "failed": [], "attempts": {},
                   "seq": time.time_ns()}
            write_json(path, rec)
            self._event("notify_queued", id=event_id, what=kind, webhooks=targets)
            self._recs[event_id] = [path, rec]
            if self._started:
                for i in targets:
                    self._enqueue(self._senders[i], event_id, time.monotonic())
                self._cond.notify_all()
        return event_id

    def _enqueue(self, s: _Sender, event_id: str, start: float) -> None:
        """Queue ``event_id`` on ``s``, its deadline counted from ``start``; a full queue
        drops its oldest message not in flight first."""
        if event_id in s.ends:
            return
        if len(s.queue) >= QUEUE_CAP:
            old = next((m for m in s.queue if m != s.inflight), None)
            if old is not None:
                s.dropped += 1
                self._settle(s, old, "dropped from a full queue", None, dropped=True)
        s.queue.append(event_id)
        s.due[event_id], s.ends[event_id] = start, start + s.deadline

    # -- the senders --
    def start(self) -> None:
        """Queue what is in the outbox (a previous supervisor's messages go at once, each
        with a deadline counted from now) and start one sender thread per webhook."""
        if not self.hooks or self._started:
            return
        with self._cond:
            self._started = True
            t = time.monotonic()
            for path, rec in self.outbox():
                event_id = rec["message"]["id"]
                self._recs[event_id] = [path, rec]
                for i in list(rec["pending"]):
                    if 0 <= i < len(self._senders):
                        self._enqueue(self._senders[i], event_id, t)
                    else:
                        rec["pending"].remove(i)
                        rec["failed"].append(i)
                        self._record(path, rec)
                        self._event("notify_error", id=event_id, webhook=i, gave_up=True,
                                    error="the job's spec has no such webhook")
        for s in self._senders:
            threading.Thread(target=self._run, args=(s,), name=f"gpujob-notify-{s.index}",
                             daemon=True).start()

    def close(self, limit: float | None = None) -> None:
        """Wait for the outbox to drain, at most ``limit`` seconds (None: the largest
        deadline, and a little for the last write): what is past its deadline then is
        given up (a sender hung where nothing can cut it, a name lookup); then let the
        secrets go if the job is over. The sender threads stop."""
        if self._started:
            with self._cond:
                end = time.monotonic() + (limit if limit is not None else self.deadline() + CLOSE_GRACE)
                while any(s.queue for s in self._senders) and time.monotonic() < end:
                    self._cond.wait(min(0.5, max(0.0, end - time.monotonic())))
                self._closed = True  # what is past its deadline now is given up, in flight or not
                for s in self._senders:
                    self._expire(s, time.monotonic())
                self._cond.notify_all()
        self.release_secrets()

    def _run(self, s: _Sender) -> None:
        while True:
            try:
                if not self._once(s):
                    return
            except Exception as e:  # a sender never dies silently, and never takes the job along
                with self._cond:
                    s.inflight = None
                    self._event("notify_error", webhook=s.index, error=f"{type(e).__name__}: {e}")
                time.sleep(1.0)

    def _once(self, s: _Sender) -> bool:
        """Wait for ``s``'s next due message and make one attempt; False once closed."""
        with self._cond:
            while True:
                if self._closed:
                    return False
                t = time.monotonic()
                self._expire(s, t)
                due = [m for m in s.queue if s.due[m] <= t]
                if due:
                    break
                self._cond.wait(min([s.due[m] - t for m in s.queue] + [5.0]))
            picked = s.inflight = due[0]
            path, rec = self._recs[picked]
            attempt = int(rec["attempts"].get(str(s.index), 0)) + 1
            rec["attempts"][str(s.index)] = attempt
            self._record(path, rec)  # before the attempt: one cut by a death counts too
            url, token = self._credentials(s.index, self.hooks[s.index])
            msg, left = rec["message"], min(s.timeout, s.ends[picked] - t)
        why = "its secret URL is gone from the container" if not url else None
        if why is None:
            body, headers = render(self.hooks[s.index]["format"], msg, token)
            why = post(url, body, headers, left)
        with self._cond:
            s.inflight = None
            self._settle(s, picked, why, attempt, final=not url)
        return True

    def _expire(self, s: _Sender, t: float) -> None:
        """Give up ``s``'s messages whose deadline has passed (not the one in flight,
        whose attempt ends by then, unless the supervisor is leaving)."""
        for event_id in [m for m in s.queue if s.ends[m] <= t and (m != s.inflight or self._closed)]:
            self._settle(s, event_id, f"its deadline passed ({s.deadline:g}s of trying)", None)

    def _settle(self, s: _Sender, event_id: str, why: str | None, attempt: int | None, final: bool = False,
                dropped: bool = False) -> None:
        """Write down how an attempt (``attempt`` None: a give-up without one) ended for
        webhook ``s``: acknowledged, retried after backoff, or given up; then its event.
        Under the lock, before the supervisor may leave (close holds the lock)."""
        entry = self._recs.get(event_id)
        if entry is None or s.index not in entry[1]["pending"]:  # settled already (given up at the end)
            return
        path, rec = entry
        t = time.monotonic()
        rec["pending"].remove(s.index)
        if why is None:
            rec["acked"].append(s.index)
        elif final or attempt is None or attempt > s.retries:
            rec["failed"].append(s.index)
            if dropped:
                rec.setdefault("dropped", []).append(s.index)
        elif t + backoff(attempt) >= s.ends[event_id]:
            rec["failed"].append(s.index)
            why += f"; its deadline ({s.deadline:g}s) passes before another attempt"
        else:
            rec["pending"].append(s.index)
            s.due[event_id] = t + backoff(attempt)
        if s.index not in rec["pending"]:
            s.queue.remove(event_id)
            s.due.pop(event_id, None)
            s.ends.pop(event_id, None)
        self._record(path, rec)  # an acknowledgement is written down before anything else
        if not rec["pending"]:
            del self._recs[event_id]  # done: its .done file holds it
        self._cond.notify_all()
        attempts = int(rec["attempts"].get(str(s.index), 0))
        if dropped:
            self._event("notify_dropped", id=event_id, webhook=s.index, dropped=s.dropped, queue=QUEUE_CAP)
        elif why is None:
            self._event("notify_sent", id=event_id, webhook=s.index, attempt=attempts)
        else:
            gave_up = s.index in rec["failed"]
            self._event("notify_error", id=event_id, webhook=s.index, attempt=attempts,
                        error=self._scrub(why),
                        gave_up=gave_up, retry_in=None if gave_up else backoff(attempts))

    def _event(self, kind: str, **data) -> None:
        try:
            self.journal.event(kind, **data)
        except Exception:  # the journal's own trouble is its to report
            pass

    def outbox(self) -> list:
        """[(path, record)] of the messages waiting, oldest first."""
        try:
            names = [n for n in os.listdir(self.dir) if n.endswith(".json")]
        except OSError:
            return []
        out = [(os.path.join(self.dir, n), read_json(os.path.join(self.dir, n))) for n in names]
        return sorted(((p, r) for p, r in out if isinstance(r, dict)), key=lambda pr: pr[1].get("seq", 0))

    def _record(self, path: str, rec: dict) -> None:
        if rec["pending"]:
            write_json(path, rec, mode=0o600)
        else:
            write_json(path[:-len(".json")] + ".done", rec, mode=0o600)
            os.unlink(path)

    # -- secrets --
    def _notify_secrets(self) -> dict:
        if self._secrets is None:
            self._secrets = (read_json(self.secrets_path, {}) or {}).get("notify") or {}
        return self._secrets

    def _credentials(self, index: int, hook: dict) -> tuple:
        given = self._notify_secrets().get(str(index)) or {}
        url = hook.get("url")
        url = given.get("url") if url == MASK or not isinstance(url, str) else url
        token = given.get("token") if hook.get("token") is not None else None
        return url, token

    def _scrub(self, text: str) -> str:
        for entry in self._notify_secrets().values():
            for value in entry.values():
                if value and len(value) >= 4:
                    text = text.replace(value, MASK)
        return text

    def kept_secrets(self) -> dict | None:
        """What of secrets.json must stay while messages wait ({"notify": ...}), or None."""
        if not self.hooks:
            return None
        self._notify_secrets()  # read before secrets.json shrinks
        return {"notify": self._secrets} if self._secrets and waiting(self.journal.dir) else None

    def release_secrets(self) -> None:
        """The job is over and its outbox empty: the webhook secrets leave the container."""
        from gpujob.agent.base.protocol import ENDED
        if self.journal.state().get("state") in ENDED and not waiting(self.journal.dir):
            try:
                os.unlink(self.secrets_path)
            except FileNotFoundError:
                pass
