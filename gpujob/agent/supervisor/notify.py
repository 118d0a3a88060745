"""Webhook notifications sent by the supervisor in the container (stdlib only): the
laptop may be off when a job rolls back or fails.

Each message is written first to the job's outbox (``notify/<id>.json`` in the job
dir), then a sender thread posts it to every webhook that asked for its kind, with a
timeout and retries with backoff; the watch loop never waits on the network. An
acknowledgement (HTTP 2xx) is written down before anything else, so a supervisor
killed mid-send re-sends only what was not acknowledged (at least once: each message
carries its id, ``X-Gpujob-Event-Id`` and ``id`` in the JSON body, for receivers to
drop a repeat) and never what was. A message no webhook waits for any more
(taken, or out of retries) becomes ``<id>.done``. A failed attempt is an event in the journal (``notify_error``, the
webhook named by its index, never its URL), never a job failure.

Webhook URLs and tokens given as secrets live in the job's 0600 ``secrets.json``
under ``notify``; they stay there after the job ends only until the outbox is empty.
"""

from __future__ import annotations

import json
import os
import threading
import time
import urllib.error
import urllib.request

from gpujob.agent.base.defaults import DEFAULTS
from gpujob.agent.base.planshare import MASK
from gpujob.agent.base.fsio import now, read_json, write_json

OUTBOX = "notify"
EVENTS = ("rollback", "failure", "success", "known_good", "no_recovery", "internal_error")
BACKOFF_CAP = 60.0
USER_AGENT = "gpujob-notify/1"

_TAGS = {"rollback": "warning", "failure": "rotating_light", "success": "white_check_mark",
         "known_good": "+1", "no_recovery": "warning", "internal_error": "bug"}
_PRIORITY = {"rollback": "high", "failure": "high", "success": "default", "known_good": "low", "no_recovery": "high",
             "internal_error": "high"}


# ---- pure: what is sent ------------------------------------------------------

def backoff(attempt: int) -> float:
    """Seconds before attempt ``attempt + 1`` (1 s, 2 s, 4 s ... at most 60 s)."""
    return min(BACKOFF_CAP, 2.0 ** max(0, attempt - 1))


def message(kind: str, event_id: str, job_id: str, name: str, at: float, **fields) -> dict:
    """gpujob's own event (what the json format posts): id, type, job, text, and the facts."""
    profile = fields.get("profile")
    title = {"rollback": f"{name}: rolled back {fields.get('from')} -> {fields.get('to')}",
             "failure": f"{name}: job failed",
             "success": f"{name}: job succeeded",
             "known_good": f"{name}: profile {profile} is known-good",
             "no_recovery": f"{name}: no recovery on {fields.get('to')}: not the profile",
             "internal_error": f"{name}: gpujob internal error (the job goes on)"}[kind]
    detail = {"rollback": fields.get("reason"), "failure": fields.get("reason"),
              "success": f"on profile {profile}" if profile else None,
              "known_good": f"baseline {fields['baseline']:.0f} tok/s" if fields.get("baseline") else None,
              "no_recovery": fields.get("reason"), "internal_error": fields.get("reason")}[kind]
    text = f"gpujob {job_id}: {title.split(': ', 1)[1]}" + (f": {detail}" if detail else "")
    return dict(fields, id=event_id, type=kind, job_id=job_id, name=name, at=round(at, 3),
                title=f"gpujob {title}", text=text)


def _latin1(text: str) -> str:
    """An HTTP header value: latin-1, one line."""
    return " ".join(text.encode("latin-1", "replace").decode("latin-1").split())[:250]


def render(fmt: str, msg: dict, token: str | None = None) -> tuple:
    """(body bytes, headers) of ``msg`` for a webhook of format ``fmt``: slack
    ({"text": ...}), ntfy (the text as the body; Title, Tags, Priority headers) or json."""
    headers = {"User-Agent": USER_AGENT, "X-Gpujob-Event-Id": _latin1(msg["id"])}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    if fmt == "slack":  # outside text is data: no <!channel>, no <url|link> (Slack's own escaping)
        text = msg["text"].replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
        body = json.dumps({"text": text}).encode()
        headers["Content-Type"] = "application/json"
    elif fmt == "ntfy":
        body = msg["text"].encode()
        headers.update({"Content-Type": "text/plain; charset=utf-8", "Title": _latin1(msg["title"]),
                        "Tags": _TAGS[msg["type"]], "Priority": _PRIORITY[msg["type"]]})
    else:
        body = json.dumps(msg, sort_keys=True).encode()
        headers["Content-Type"] = "application/json"
    return body, headers


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """A redirect is never followed: urllib would resend the headers (the Bearer
    token) to wherever the Location points, as a GET whose 2xx is not an answer to
    the POST. The 3xx comes back as an HTTPError: a failed attempt, retried."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        return None


_OPENER = urllib.request.build_opener(_NoRedirect)


def post(url: str, body: bytes, headers: dict, timeout: float) -> str | None:
    """One attempt; None when acknowledged (a 2xx to this POST itself), else why not
    (without the URL)."""
    req = urllib.request.Request(url, data=body, headers=headers, method="POST")
    try:
        with _OPENER.open(req, timeout=timeout) as resp:
            resp.read(65536)
            return None if 200 <= resp.status < 300 else f"HTTP {resp.status}"
    except urllib.error.HTTPError as e:
        if 300 <= e.code < 400:
            return f"HTTP {e.code}: a redirect, not followed (a webhook URL must answer the POST itself)"
        return f"HTTP {e.code}"
    except urllib.error.URLError as e:
        return f"cannot reach the webhook: {type(e.reason).__name__}: {getattr(e.reason, 'strerror', None) or e.reason}"
    except (OSError, ValueError) as e:  # timeouts, resets, a malformed URL
        return f"{type(e).__name__}: {getattr(e, 'strerror', None) or e}"
    except Exception as e:  # noqa: BLE001 - http.client.HTTPException (150 headers, a bad status line)
        # and whatever else an answer causes: a failed attempt like any other, counted against retries
        return f"{type(e).__name__}: {str(e)[:200]}"


# ---- the outbox and its sender -------------------------------------------------

def waiting(job_dir: str) -> bool:
    """Messages in the job's outbox that some webhook has not taken yet."""
    try:
        return any(n.endswith(".json") for n in os.listdir(os.path.join(job_dir, OUTBOX)))
    except OSError:
        return False


def outbox_summary(job_dir: str) -> dict | None:
    """How the job's messages stand (for status): waiting, taken by every webhook,
    given up by some; None when the job has no outbox."""
    try:
        names = os.listdir(os.path.join(job_dir, OUTBOX))
    except OSError:
        return None
    done = [read_json(os.path.join(job_dir, OUTBOX, n)) or {} for n in names if n.endswith(".done")]
    return {"waiting": sum(n.endswith(".json") for n in names),
            "sent": sum(1 for r in done if not r.get("failed")),
            "given_up": sorted((r.get("message") or {}).get("id", "?") for r in done if r.get("failed"))}


class Notifier:
    """One job's outbox and the thread that drains it. ``emit`` (any thread) writes a
    message down and wakes the sender; ``close`` waits until the outbox is drained
    (every webhook acknowledged or out of retries)."""

    def __init__(self, journal, job: dict, secrets_path: str):
        self.journal = journal
        self.job = job
        self.hooks = [{**DEFAULTS["notify"], **h} for h in job.get("spec", {}).get("notify") or []]
        self.dir = journal.path(OUTBOX)
        self.secrets_path = secrets_path
        self._secrets: dict | None = None
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._next: dict = {}  # (id, webhook index) -> monotonic time of the next attempt
        self._busy = False

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
                self.journal.event("notify_error", error=f"cannot queue the {kind} message: {type(e).__name__}: {e}")
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
        if os.path.exists(path) or os.path.exists(os.path.join(self.dir, event_id + ".done")):
            return event_id
        os.makedirs(self.dir, exist_ok=True)
        msg = message(kind, event_id, job_id, self.job.get("spec", {}).get("name", ""), now(), **fields)
        write_json(path, {"message": msg, "pending": targets, "acked": [], "failed": [], "attempts": {},
                          "seq": time.time_ns()})
        self.journal.event("notify_queued", id=event_id, what=kind, webhooks=targets)
        self._wake.set()
        return event_id

    # -- the sender --
    def start(self) -> None:
        if self.hooks and self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="gpujob-notify", daemon=True)
            self._thread.start()
            self._wake.set()  # what a previous supervisor left in the outbox goes at once

    def close(self, limit: float | None = None) -> None:
        """Wait for the outbox to drain (at most ``limit`` seconds; None: as long as the
        webhooks' retries take), then let the secrets go if the job is over."""
        if self._thread is not None:
            end = time.monotonic() + (limit if limit is not None else self._worst_case())
            self._wake.set()
            while time.monotonic() < end and (waiting(self.journal.dir) or self._busy):
                time.sleep(0.05)
        self.release_secrets()

    def _worst_case(self) -> float:
        per = [(int(h["retries"]) + 1) * float(h["timeout"])
               + sum(backoff(a) for a in range(1, int(h["retries"]) + 1)) for h in self.hooks]
        return 10.0 + 4 * sum(per)

    def _loop(self) -> None:
        while True:
            self._wake.wait(self._due_in())
            self._wake.clear()
            try:
                self._busy = True
                self.drain_once()
            except Exception as e:  # the sender never dies silently, and never takes the job along
                try:
                    self.journal.event("notify_error", error=f"{type(e).__name__}: {e}")
                except Exception:
                    pass
                time.sleep(1.0)
            finally:
                self._busy = False

    def _due_in(self) -> float:
        if not self._next:
            return 5.0
        return max(0.0, min(self._next.values()) - time.monotonic())

    def outbox(self) -> list:
        """[(path, record)] of the messages waiting, oldest first."""
        try:
            names = [n for n in os.listdir(self.dir) if n.endswith(".json")]
        except OSError:
            return []
        out = [(os.path.join(self.dir, n), read_json(os.path.join(self.dir, n))) for n in names]
        return sorted(((p, r) for p, r in out if isinstance(r, dict)), key=lambda pr: pr[1].get("seq", 0))

    def drain_once(self) -> None:
        """Try every (message, webhook) that is due once."""
        for path, rec in self.outbox():
            msg = rec["message"]
            for index in list(rec["pending"]):
                key = (msg["id"], index)
                if self._next.get(key, 0.0) > time.monotonic():
                    continue
                self._next.pop(key, None)
                hook = self.hooks[index] if index < len(self.hooks) else dict(DEFAULTS["notify"], retries=0)
                url, token = self._credentials(index, hook)
                attempt = int(rec["attempts"].get(str(index), 0)) + 1
                why = "its secret URL is gone from the container" if not url else None
                if why is None:
                    body, headers = render(hook["format"], msg, token)
                    why = post(url, body, headers, float(hook["timeout"]))
                rec["attempts"][str(index)] = attempt
                rec["pending"].remove(index)
                if why is None:
                    rec["acked"].append(index)
                elif attempt > int(hook["retries"]) or not url:
                    rec["failed"].append(index)
                else:
                    rec["pending"].append(index)
                    self._next[key] = time.monotonic() + backoff(attempt)
                self._record(path, rec)  # an acknowledgement is written down before anything else
                if why is None:
                    self.journal.event("notify_sent", id=msg["id"], webhook=index, attempt=attempt)
                else:
                    gave_up = index in rec["failed"]
                    self.journal.event("notify_error", id=msg["id"], webhook=index, attempt=attempt,
                                       error=self._scrub(why), gave_up=gave_up,
                                       retry_in=None if gave_up else backoff(attempt))

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
