"""Webhook notifications and Prometheus metrics (agent/supervisor/notify.py, agent/supervisor/metrics.py):
the pure parts fast, then real jobs on the `local` target posting to a real HTTP
server in the test, with a supervisor SIGKILLed while a message waits in its outbox."""

from __future__ import annotations

import http.server
import json
import os
import re
import signal
import threading
from pathlib import Path

import pytest

from gpujob.agent.supervisor import metrics, notify
from gpujob.agent.base import planshare
from helpers import cli, cli_json, events, job_id_of, local_env, wait_for, write_spec

SECRET_PATH = "T0SECRET/B0SECRET/xoxb-hook-secret-771"
SECRET_TOKEN = "tk_ntfy-secret-token-5521"


class HookServer:
    """A webhook receiver on loopback: records every POST; paths in ``fail`` answer
    HTTP 500 as many times as their count says, paths in ``down`` always."""

    def __init__(self):
        self.posts: list = []  # {"path", "headers", "body", "status"}
        self.fail: dict = {}
        self.down: set = set()
        self.lock = threading.Lock()
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                with server.lock:
                    path = self.path
                    bad = path in server.down or server.fail.get(path, 0) > 0
                    if server.fail.get(path, 0) > 0:
                        server.fail[path] -= 1
                    status = 500 if bad else 200
                    server.posts.append({"path": path, "headers": dict(self.headers), "body": body,
                                         "status": status})
                self.send_response(status)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *a):
                pass
        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def received(self, path: str, ok_only: bool = True) -> list:
        with self.lock:
            return [p for p in self.posts if p["path"] == path and (p["status"] == 200 or not ok_only)]

    def ids(self, path: str, ok_only: bool = True) -> list:
        return [p["headers"]["X-Gpujob-Event-Id"] for p in self.received(path, ok_only)]

    def close(self):
        self.httpd.shutdown()


@pytest.fixture
def hooks():
    h = HookServer()
    yield h
    h.close()


# ---- pure ------------------------------------------------------------------------

def test_each_format_renders_as_its_receiver_expects():
    msg = notify.message("rollback", "j-1.rollback.1", "j-1", "tjob", 100.0, **{
        "from": "slow", "to": "fast", "reason": "median 4.9K < 10K", "signal": "low_throughput"})
    body, headers = notify.render("slack", msg)
    assert json.loads(body) == {"text": "gpujob j-1: rolled back slow -&gt; fast: median 4.9K &lt; 10K"}
    assert headers["Content-Type"] == "application/json" and headers["X-Gpujob-Event-Id"] == "j-1.rollback.1"
    body, headers = notify.render("ntfy", msg, token="tok")
    assert body.decode() == msg["text"]
    assert (headers["Title"], headers["Tags"], headers["Priority"]) == \
        ("gpujob tjob: rolled back slow -> fast", "warning", "high")
    assert headers["Authorization"] == "Bearer tok"
    body, _ = notify.render("json", msg)
    sent = json.loads(body)
    assert (sent["id"], sent["type"], sent["from"], sent["to"]) == ("j-1.rollback.1", "rollback", "slow",
                                                                    "fast")
    # outside text never breaks a header: one latin-1 line
    odd = notify.message("failure", "x", "j", "n\r\nX-Evil: 1 ☃", 0.0, reason="r")
    assert "\n" not in notify.render("ntfy", odd)[1]["Title"]
    assert [notify.backoff(a) for a in (1, 2, 3, 8, 20)] == [1, 2, 4, 60, 60]
    # a trainer's line in a reason cannot ping a Slack channel or make a link
    loud = notify.message("failure", "x", "j", "n", 0.0, reason="<!channel> see <http://evil|here> & more")
    assert json.loads(notify.render("slack", loud)[0])["text"] == \
        "gpujob j: job failed: &lt;!channel&gt; see &lt;http://evil|here&gt; &amp; more"


PROM_LINE = re.compile(r'^(# (HELP|TYPE) [a-zA-Z_:][a-zA-Z0-9_:]* .+|'
                       r'[a-zA-Z_:][a-zA-Z0-9_:]*(\{([a-zA-Z_][a-zA-Z0-9_]*="([^"\\\n]|\\[\\"n])*",?)*\})? '
                       r'[-+]?([0-9.]+([eE][-+]?[0-9]+)?|NaN|[-+]Inf))$')


def parse_prom(text: str) -> dict:
    """{(metric, frozenset(labels)): value}; every line must be valid exposition format."""
    out = {}
    assert text.endswith("\n")
    for line in text.splitlines():
        assert PROM_LINE.match(line), f"not exposition format: {line!r}"
        if line.startswith("#"):
            continue
        name_labels, value = line.rsplit(" ", 1)
        name, _, labels = name_labels.partition("{")
        pairs = re.findall(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"', labels)
        unescaped = {k: v.replace("\\n", "\n").replace('\\"', '"').replace("\\\\", "\\") for k, v in pairs}
        out[(name, frozenset(unescaped.items()))] = float(value)
    return out


def test_exposition_escapes_outside_text_and_leaves_out_what_is_unknown():
    st = {"state": "training", "profile": 'we"ird\\pro\nfile', "tps": 12800.5,
          "window": {"median": 12000.0, "threshold": 10000.0}, "rollbacks": [{}], "baseline": None}
    g = metrics.gauges(st, "j-1", "tjob")
    got = parse_prom(metrics.exposition(g, 1.5))
    labels = frozenset({"job_id": "j-1", "job_name": "tjob", "profile": st["profile"]}.items())
    assert got[("gpujob_tokens_per_second", labels)] == 12800.5
    assert got[("gpujob_window_median_tokens_per_second", labels)] == 12000.0
    assert got[("gpujob_threshold_tokens_per_second", labels)] == 10000.0
    assert not any(k[0] == "gpujob_known_good_baseline_tokens_per_second" for k in got)  # no value yet
    job = {("job_id", "j-1"), ("job_name", "tjob")}
    assert got[("gpujob_rollbacks_total", frozenset(job))] == 1
    states = {dict(k[1])["state"]: v for k, v in got.items() if k[0] == "gpujob_state"}
    assert states == {s: float(s == "training") for s in metrics.STATES}
    assert set(metrics.STATES) >= {"preparing", "training", "succeeded", "failed", "lost"}


BASE = """\
name: nt
profiles:
  - {name: fast, index_url: "https://i/simple", packages: ["a==1"]}
train: {command: python t.py}
"""


@pytest.mark.parametrize("block, message", [
    ("notify:\n  - url: hooks.slack.com/services/T/B/sekret\n",
     "job.yaml:6: notify[0].url: expected an http(s):// URL or {from_env: VAR} / {from_file: PATH}, got a "
     "string that does not start with http:// or https:// (not echoed: it may hold a token)"),
    ("notify:\n  - url: https://u:pw@h/x\n", "job.yaml:6: notify[0].url: this URL holds credentials"),
    ("notify:\n  - url: https://h/x\n    token: abc\n", "job.yaml:7: notify[0].token: a token is a secret"),
    ("notify:\n  - url: https://h/x\n    format: teams\n", "job.yaml:7: notify[0].format:"),
    ("notify:\n  - url: https://h/x\n    events: [success, success]\n",
     "job.yaml:7: notify[0].events[1]: 'success' is listed twice"),
    ("notify:\n  - url: https://h/x\n    events: [stopped]\n", "job.yaml:7: notify[0].events[0]:"),
    ("notify:\n  - url: https://h/x\n    retries: 99\n", "job.yaml:7: notify[0].retries: must be <= 20"),
    ("notify:\n  - url: {from_env: 'a b'}\n", "job.yaml:6: notify[0].url.from_env: expected a variable name"),
    ("metrics: {textfile: /var/lib/node_exporter/gpujob.txt}\n",
     "job.yaml:5: metrics.textfile: expected a path ending in .prom"),
    ("metrics: {every: 0.1}\n", "job.yaml:5: metrics.every: must be >= 1"),
])
def test_bad_notify_and_metrics_blocks_are_one_line_with_file_and_line(tmp_path, block, message):
    from gpujob.errors import SpecError
    from gpujob.spec.model import load_spec
    (tmp_path / "job.yaml").write_text(BASE + block)
    with pytest.raises(SpecError) as e:
        load_spec(tmp_path / "job.yaml")
    text = str(e.value)
    assert "\n" not in text and message in text, text


def test_webhook_secrets_ride_apart_masked_everywhere_else(tmp_path, monkeypatch):
    from gpujob.ops.plan import job_request
    from gpujob.spec import secrets as secrets_env
    from gpujob.errors import SpecError
    from gpujob.spec.model import load_spec
    (tmp_path / "tok").write_text("tok-123456\n")
    (tmp_path / "job.yaml").write_text(BASE + "notify:\n  - url: {from_env: HOOK}\n    format: slack\n"
                                       "  - url: https://ntfy.sh/t\n    format: ntfy\n    token: {from_file: "
                                       "tok}\n")
    spec = load_spec(tmp_path / "job.yaml")
    with pytest.raises(SpecError, match=r"job.yaml:6: notify\[0\].url: from_env: \$HOOK is not set"):
        secrets_env.resolve(spec)
    monkeypatch.setenv("HOOK", "https://hooks.slack.com/services/T/B/sekret99")
    secrets = secrets_env.resolve(spec)
    assert secrets["notify"] == {"0": {"url": "https://hooks.slack.com/services/T/B/sekret99"},
                                 "1": {"token": "tok-123456"}}
    req = job_request(spec, "nt-1", "fast", clear_caches=False, secrets=secrets)
    assert req.secret_names == ["notify[0].url", "notify[1].token"]
    assert [h["url"] for h in req.spec["notify"]] == ["***", "https://ntfy.sh/t"]
    assert "sekret99" not in json.dumps(req.spec) and "tok-123456" not in json.dumps(req.spec)
    assert secrets_env.scrub("posting to https://hooks.slack.com/services/T/B/sekret99 failed", secrets) == \
        "posting to *** failed"
    assert planshare.describe(0, req.spec["notify"][0]) == "notify[0] (slack, a secret URL)"


SENDER = """
import sys
from gpujob.agent.home.journal import Home, Journal
from gpujob.agent.supervisor.notify import Notifier
root, url = sys.argv[1:3]
j = Journal(Home(root), "nt-1")
hooks = [{"url": url + "/ok", "events": ["failure"]}, {"url": url + "/kill", "events": ["failure"]}]
n = Notifier(j, {"spec": {"name": "nt", "notify": hooks}}, j.path("secrets.json"))
n.emit("failure", "end", reason="boom")  # the same message when run again: kept once
n.start()
n.close(limit=30)
"""


def test_a_sender_killed_mid_post_resends_that_message_only_where_it_was_not_acknowledged(tmp_path, hooks):
    import subprocess
    import sys
    (tmp_path / "jobs" / "nt-1").mkdir(parents=True)
    (tmp_path / "jobs" / "nt-1" / "state.json").write_text('{"state": "failed"}')
    argv = [sys.executable, "-c", SENDER, str(tmp_path), hooks.url]
    first = subprocess.Popen(argv, cwd=str(Path(__file__).resolve().parents[2]))
    killed = threading.Event()
    real = hooks.httpd.RequestHandlerClass.do_POST

    def do_post(handler):  # the sender dies while /kill holds its message, before any answer
        if handler.path == "/kill" and not killed.is_set():
            rec = tmp_path / "jobs" / "nt-1" / "notify" / "nt-1.failure.end.json"  # each webhook has its own
            wait_for(lambda: 0 in json.loads(rec.read_text())["acked"], 30, what="/ok's acknowledgement")
            killed.set()
            os.kill(first.pid, signal.SIGKILL)
            first.wait()
        real(handler)
    hooks.httpd.RequestHandlerClass.do_POST = do_post
    assert first.wait(60) == -signal.SIGKILL and killed.is_set()
    d = tmp_path / "jobs" / "nt-1"
    assert notify.waiting(str(d))
    second = subprocess.run(argv, cwd=str(Path(__file__).resolve().parents[2]), timeout=60)
    assert second.returncode == 0
    assert not notify.waiting(str(d))
    assert hooks.ids("/ok") == ["nt-1.failure.end"]  # acknowledged before the death: never again
    assert hooks.ids("/kill", ok_only=False) == ["nt-1.failure.end"] * 2  # at least once, same id
    assert [p["status"] for p in hooks.received("/kill", ok_only=False)] == [200, 200]
    rec = json.loads((d / "notify" / "nt-1.failure.end.done").read_text())
    assert (rec["acked"], rec["failed"], rec["pending"]) == ([0, 1], [], [])


# ---- real jobs on the local target ---------------------------------------------------

def jdir(tmp_path: Path, job_id: str) -> Path:
    return tmp_path / "root" / "jobs" / job_id


def all_text(d: Path) -> str:
    return "".join(p.read_text(errors="replace") for p in d.rglob("*") if p.is_file())


def test_webhooks_get_rollback_known_good_and_success_and_no_secret_is_written(tmp_path, index_urls, hooks):
    env = local_env(tmp_path)
    env["HOOK_URL"] = f"{hooks.url}/slack/{SECRET_PATH}"
    (tmp_path / "ntfy.token").write_text(SECRET_TOKEN + "\n")
    hooks.fail["/flaky"] = 2  # the json receiver fails twice, then takes it
    spec = write_spec(tmp_path / "job.yaml", target="box", fast_url=index_urls["fast"],
                      slow_url=index_urls["slow"], trainer_args="--steps 40 --interval 0.05",
                      rollback={"fallback": ["fast"]},
                      notify=[{"url": {"from_env": "HOOK_URL"}, "format": "slack"},
                              {"url": f"{hooks.url}/ntfy/gpujob", "format": "ntfy",
                               "token": {"from_file": "ntfy.token"}, "events": ["rollback", "success"]},
                              {"url": f"{hooks.url}/flaky", "format": "json", "events": ["success"],
                               "timeout": "5s", "retries": 3}],
                      metrics={"textfile": "{job_id}.prom", "every": "1s"})
    p = cli(["submit", str(spec), "--follow"], env, timeout=180)
    assert p.returncode == 0, p.stdout.decode()[-3000:]
    job_id = job_id_of(p.stdout)
    slack = f"/slack/{SECRET_PATH}"
    wait_for(lambda: hooks.received("/flaky"), 60, what="the flaky receiver to take the message")
    wait_for(lambda: not notify.waiting(str(jdir(tmp_path, job_id))), 30, what="the outbox to drain")
    # slack: rollback, known-good, success, in that order, as {"text": ...}
    texts = [json.loads(p["body"]) for p in hooks.received(slack)]
    assert [set(t) for t in texts] == [{"text"}] * 3
    assert [h.split(".")[1] for h in hooks.ids(slack)] == ["rollback", "known_good", "success"]
    assert "rolled back slow -&gt; fast" in texts[0]["text"] and "known-good" in texts[1]["text"]
    # ntfy: only the kinds it asked for; plain text; its headers; the token as a bearer
    ntfy = hooks.received("/ntfy/gpujob")
    assert [p["headers"]["Tags"] for p in ntfy] == ["warning", "white_check_mark"]
    assert ntfy[1]["headers"]["Title"] == "gpujob tjob: job succeeded"
    assert ntfy[1]["body"].decode() == f"gpujob {job_id}: job succeeded: on profile fast"
    assert {p["headers"]["Authorization"] for p in ntfy} == {f"Bearer {SECRET_TOKEN}"}
    # the flaky one: two refusals, then the message once; ids let a receiver drop repeats
    tries = hooks.received("/flaky", ok_only=False)
    assert [t["status"] for t in tries] == [500, 500, 200]
    assert len({t["headers"]["X-Gpujob-Event-Id"] for t in tries}) == 1
    sent = json.loads(tries[-1]["body"])
    assert (sent["type"], sent["job_id"], sent["profile"], sent["rollbacks"]) == ("success", job_id, "fast",
                                                                                  1)
    ev = events(jdir(tmp_path, job_id))
    errors = [e for e in ev if e["type"] == "notify_error"]
    assert [(e["webhook"], e["attempt"], e["error"], e["gave_up"]) for e in errors] == \
        [(2, 1, "HTTP 500", False), (2, 2, "HTTP 500", False)]
    wait_for(lambda: len([e for e in events(jdir(tmp_path, job_id)) if e["type"] == "notify_sent"]) == 3 + 2
             + 1, 10, what="an event for each message taken")
    # the secrets: in no file of the job (secrets.json is gone now the outbox is empty), no argv
    d = jdir(tmp_path, job_id)
    wait_for(lambda: not (d / "secrets.json").exists(), 10, what="the secrets to leave with the last message")
    text = all_text(d) + p.stdout.decode() + p.stderr.decode()
    assert SECRET_PATH not in text and SECRET_TOKEN not in text
    assert "notify[0].url" in json.loads((d / "job.json").read_text())["secret_names"]
    # metrics: the textfile parses and says what the samples say; status --json carries the same
    got = parse_prom((d / f"{job_id}.prom").read_text())
    samples = [json.loads(ln) for ln in (d / "samples.jsonl").read_text().splitlines()]
    st = cli_json(["status", job_id, "--json"], env)
    labels = frozenset({"job_id": job_id, "job_name": "tjob", "profile": "fast"}.items())
    assert got[("gpujob_tokens_per_second", labels)] == samples[-1]["value"] == st["metrics"]["tok_s"]
    assert got[("gpujob_window_median_tokens_per_second", labels)] == st["window_median"] \
        == st["metrics"]["window_median"] == samples[-1]["median"]
    assert got[("gpujob_threshold_tokens_per_second", labels)] == 10000 == st["metrics"]["threshold"]
    assert got[("gpujob_known_good_baseline_tokens_per_second", labels)] == st["metrics"]["baseline"] > 10000
    job = frozenset({"job_id": job_id, "job_name": "tjob"}.items())
    assert got[("gpujob_rollbacks_total", job)] == 1 == st["metrics"]["rollbacks"]
    assert got[("gpujob_state", job | {("state", "succeeded")})] == 1
    assert st["metrics"]["state"] == "succeeded" and st["metrics"]["profile"] == "fast"
    assert st["notify"] == {"waiting": 0, "sent": 3, "given_up": [], "dropped": 0}


def test_the_plan_shows_the_webhooks_and_the_textfile_never_a_secret(tmp_path, index_urls):
    env = dict(local_env(tmp_path), HOOK_URL=f"https://hooks.example/{SECRET_PATH}")
    spec = write_spec(tmp_path / "job.yaml", target="box", fast_url=index_urls["fast"],
                      slow_url=index_urls["slow"],
                      notify=[{"url": {"from_env": "HOOK_URL"}, "format": "slack"},
                              {"url": "https://ntfy.sh/t", "format": "ntfy", "events": ["failure"]}],
                      metrics={"textfile": "/var/lib/node_exporter/textfile/gpujob-{job_id}.prom"})
    p = cli(["submit", str(spec), "--plan", "--job-id", "tjob-plan"], env)
    assert p.returncode == 0, p.stderr.decode()
    out = " ".join(p.stdout.decode().split())
    assert ("post to notify[0] (slack, a secret URL)" in out
            and "(on rollback, failure, success, known_good, no_recovery, internal_error)" in out)
    assert "post to notify[1] (ntfy, https://ntfy.sh/t)" in out and "(on failure)" in out
    assert "notify[0].url=*** (from $HOOK_URL)" in out
    assert "gauges to /var/lib/node_exporter/textfile/gpujob-tjob-plan.prom" in out
    assert SECRET_PATH not in p.stdout.decode() + p.stderr.decode()
    assert not (tmp_path / "root").exists()


def test_a_supervisor_killed_with_messages_in_its_outbox_delivers_them_after_revival(tmp_path, index_urls,
                                                                                   hooks):
    env = dict(local_env(tmp_path), HOOK_URL=f"{hooks.url}/hook")
    hooks.down.add("/hook")
    spec = write_spec(tmp_path / "job.yaml", target="box", fast_url=index_urls["fast"],
                      slow_url=index_urls["slow"], profile="fast", warmup=False,
                      trainer_args="--steps 80 --interval 0.1",
                      notify=[{"url": {"from_env": "HOOK_URL"}, "events": ["known_good", "success"],
                               "timeout": "5s", "retries": 20}])
    job_id = job_id_of(cli(["submit", str(spec)], env, check=True).stdout)
    d = jdir(tmp_path, job_id)

    def state():
        return json.loads((d / "state.json").read_text())
    # 1. mid-job: the known-good message is refused, the supervisor dies, a new one sends it
    wait_for(lambda: any(e["type"] == "notify_error" for e in events(d)), 60, what="a refused known_good")
    os.kill(state()["supervisor_pid"], signal.SIGKILL)
    assert notify.waiting(str(d))
    hooks.down.clear()
    cli(["status", job_id], env, check=True)  # revives the supervisor; it re-adopts the trainer
    wait_for(lambda: hooks.ids("/hook"), 30, what="the known_good message after revival")
    assert [i.split(".")[1] for i in hooks.ids("/hook")] == ["known_good"]
    # 2. after the end: the success message is refused, the supervisor dies while it waits
    hooks.down.add("/hook")
    wait_for(lambda: state().get("state") == "succeeded", 60, what="the job to succeed")
    wait_for(lambda: any(e["type"] == "notify_error" and ".success." in e["id"] for e in events(d)), 30,
             what="a refused success message")
    os.kill(state()["supervisor_pid"], signal.SIGKILL)
    # the job is over, its secret URL stays for the message that waits, and only that
    assert json.loads((d / "secrets.json").read_text()) == {"notify": {"0": {"url": f"{hooks.url}/hook"}}}
    hooks.down.clear()
    revived = cli_json(["status", job_id, "--json"], env)
    assert revived["state"] == "succeeded"
    wait_for(lambda: len(hooks.ids("/hook")) == 2, 30, what="the success message after revival")
    wait_for(lambda: not notify.waiting(str(d)), 30, what="the outbox to drain")
    ids = hooks.ids("/hook")
    assert [i.split(".")[1] for i in ids] == ["known_good", "success"]  # each acknowledged once
    assert any(e["type"] == "notify_resumed" for e in events(d))
    wait_for(lambda: not (d / "secrets.json").exists(), 10, what="the secret URL to leave")
    assert json.loads((d / "state.json").read_text())["state"] == "succeeded"  # the end was not redone
    assert [e["type"] for e in events(d) if e["type"] == "state"].count("state") == \
        len([e for e in events(d) if e["type"] == "state"])
    assert [e.get("state") for e in events(d) if e["type"] == "state"].count("succeeded") == 1


def test_a_webhook_that_never_answers_is_an_event_never_a_job_failure(tmp_path, index_urls, hooks):
    env = local_env(tmp_path)
    hooks.down.add("/dead")
    spec = write_spec(tmp_path / "job.yaml", target="box", fast_url=index_urls["fast"],
                      slow_url=index_urls["slow"], profile="fast", warmup=False, throughput=False,
                      trainer_args="--steps 3 --interval 0.01",
                      notify=[{"url": f"{hooks.url}/dead", "events": ["success"], "retries": 1}])
    p = cli(["submit", str(spec), "--follow"], env, timeout=120)
    assert p.returncode == 0, p.stdout.decode()[-2000:]
    d = jdir(tmp_path, job_id_of(p.stdout))
    wait_for(lambda: any(e["type"] == "notify_error" and e["gave_up"] for e in events(d)), 30,
             what="the sender to give up")
    assert json.loads((d / "state.json").read_text())["state"] == "succeeded"
    assert len(hooks.received("/dead", ok_only=False)) == 2
    wait_for(lambda: not notify.waiting(str(d)), 10, what="the outbox to close")
    assert [p.name.split(".")[1] for p in (d / "notify").iterdir()] == ["success"]
    assert cli_json(["status", job_id_of(p.stdout), "--json"], env)["notify"] == \
        {"waiting": 0, "sent": 0, "given_up": [f"{job_id_of(p.stdout)}.success.end"], "dropped": 0}
    # without throughput, a job that exits 0 makes its profile known-good: that is sent too
    hooks.down.clear()
    spec = write_spec(tmp_path / "job2.yaml", target="box", fast_url=index_urls["fast"],
                      slow_url=index_urls["slow"], profile="slow", warmup=False, throughput=False,
                      trainer_args="--steps 3 --interval 0.01", notify=[{"url": f"{hooks.url}/ok"}])
    p = cli(["submit", str(spec), "--follow"], env, timeout=120)
    assert p.returncode == 0, p.stdout.decode()[-2000:]
    wait_for(lambda: len(hooks.ids("/ok")) == 2, 30, what="two messages")
    assert [i.split(".")[1] for i in hooks.ids("/ok")] == ["known_good", "success"]


def test_a_job_restarted_by_hand_after_its_end_keeps_no_env_secret_but_sends_what_waited(tmp_path, index_urls,
                                                                                         hooks):
    env = dict(local_env(tmp_path), HOOK_URL=f"{hooks.url}/hook", TOK_VALUE="env-secret-value-8812")
    hooks.down.add("/hook")
    spec = write_spec(tmp_path / "job.yaml", target="box", fast_url=index_urls["fast"],
                      slow_url=index_urls["slow"], profile="fast", warmup=False,
                      trainer_args="--steps 400 --interval 0.05", env={"TOK": {"from_env": "TOK_VALUE"}},
                      notify=[{"url": {"from_env": "HOOK_URL"}, "events": ["known_good", "failure"],
                               "retries": 20}])
    job_id = job_id_of(cli(["submit", str(spec)], env, check=True).stdout)
    d = jdir(tmp_path, job_id)
    wait_for(lambda: any(e["type"] == "notify_error" for e in events(d)), 60, what="a refused known_good")
    cli(["stop", job_id], env, check=True)
    # stopped: the env secret is gone, the webhook's stays for the message that waits
    assert json.loads((d / "secrets.json").read_text()) == {"notify": {"0": {"url": f"{hooks.url}/hook"}}}
    sender = json.loads((d / "state.json").read_text())["supervisor_pid"]
    p = cli(["rollback", job_id, "--to", "slow"], env, check=True)  # ends the sender, starts a supervisor
    assert "restarted" in p.stdout.decode()
    wait_for(lambda: not os.path.exists(f"/proc/{sender}") or
             open(f"/proc/{sender}/stat").read().split(")")[1].split()[0] == "Z", 10,
             what="the old sender to go")
    wait_for(lambda: json.loads((d / "state.json").read_text()).get("state") == "failed", 60, what="the end")
    assert "secrets were removed" in json.loads((d / "state.json").read_text())["reason"]
    hooks.down.clear()
    wait_for(lambda: len(hooks.ids("/hook")) == 2, 30, what="known_good and failure")
    assert sorted(i.split(".")[1] for i in hooks.ids("/hook")) == ["failure", "known_good"]
    wait_for(lambda: not (d / "secrets.json").exists(), 30, what="the webhook secret to leave")
    assert "env-secret-value-8812" not in all_text(d)


def test_an_answer_with_150_headers_is_a_failed_attempt_never_an_exception():
    """Issue 35 row 7: http.client.HTTPException (too many headers) is one failed attempt,
    counted against retries like any other, not an escape into the sender loop's catch-all."""
    import socket
    import threading

    from gpujob.agent.supervisor.notify import post
    ls = socket.socket()
    ls.bind(("127.0.0.1", 0))
    ls.listen(4)

    def serve() -> None:
        c, _ = ls.accept()
        c.recv(65536)
        c.sendall(b"HTTP/1.1 200 OK\r\n" + b"".join(b"X-H%d: v\r\n" % i for i in range(150))
                  + b"Content-Length: 0\r\n\r\n")
        c.close()

    threading.Thread(target=serve, daemon=True).start()
    try:
        why = post(f"http://127.0.0.1:{ls.getsockname()[1]}/hook", b"{}", {}, timeout=10)
    finally:
        ls.close()
    assert why is not None and ("HTTPException" in why or "headers" in why), why
