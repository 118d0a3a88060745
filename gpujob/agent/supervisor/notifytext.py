"""What a webhook message says and how each receiver gets it (pure, stdlib only; the
sender is agent/supervisor/notify.py)."""

from __future__ import annotations

import json

EVENTS = ("rollback", "failure", "success", "known_good", "no_recovery", "internal_error")
BACKOFF_CAP = 60.0
USER_AGENT = "gpujob-notify/1"

_TAGS = {"rollback": "warning", "failure": "rotating_light", "success": "white_check_mark",
         "known_good": "+1", "no_recovery": "warning", "internal_error": "bug"}
_PRIORITY = {"rollback": "high", "failure": "high", "success": "default", "known_good": "low",
             "no_recovery": "high", "internal_error": "high"}


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
