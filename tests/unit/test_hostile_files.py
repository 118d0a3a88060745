"""Issue 24, item 3: the files the container's root writes. The rc.local boot hook
(nothing in its line can end it; before the last exit; a shebang; a symlink edited
through; removed fully) and the supervisor's atomic writes (a planted symlink or
file is never written through)."""

from __future__ import annotations

import os
import subprocess

import pytest

from gpujob.agent.supervisor import boothook, metrics
from gpujob.agent.base import fsio

PY, AGENT = "/usr/bin/python3", "/root/.gpujob/bin/agent.pyz"


def test_a_home_with_a_newline_never_reaches_rc_local(tmp_path):
    rc = tmp_path / "rc.local"
    rc.write_text("#!/bin/sh\nexit 0\n")
    for home in ("/root/x\ntouch /tmp/P #", "/root/x\rtouch", "/root/\x00x"):
        with pytest.raises(ValueError, match="control character"):
            boothook.install(PY, AGENT, home, str(rc))
    assert rc.read_text() == "#!/bin/sh\nexit 0\n"


def test_odd_but_legal_homes_stay_one_quoted_line_that_sh_reads_as_one_command(tmp_path):
    rc = tmp_path / "rc.local"
    home = "/root/my home; touch P #'$(x)`"
    line = boothook.install(PY, AGENT, home, str(rc))
    assert line in rc.read_text().splitlines()
    out = subprocess.run(["sh", "-n", str(rc)], capture_output=True)  # parses
    assert out.returncode == 0, out.stderr
    assert boothook.remove(home, str(rc)) and rc.read_text() == boothook.HEADER


@pytest.mark.parametrize("tail", ["exit 0 # the end\n", "exit 1\n", "exit 0\n# trailing comment\n\n",
                                  "exit\n", "exit 0;\n"])
def test_the_hook_goes_before_the_last_exit_whatever_follows(tmp_path, tail):
    rc = tmp_path / "rc.local"
    rc.write_text("#!/bin/sh -e\nif false; then\n  exit 3\nfi\n/usr/local/bin/site\n" + tail)
    line = boothook.install(PY, AGENT, "/root/.gpujob", str(rc))
    lines = rc.read_text().splitlines()
    exit_at = max(i for i, ln in enumerate(lines) if ln.startswith("exit"))
    assert lines.index(line) == exit_at - 1 and lines[exit_at - 2] == "/usr/local/bin/site"
    assert "  exit 3" in lines  # the indented exit in a block is left alone


def test_a_missing_shebang_is_added_and_the_file_runs(tmp_path):
    rc = tmp_path / "rc.local"
    rc.write_text("echo site-setup\nexit 0\n")
    boothook.install(PY, AGENT, "/root/.gpujob", str(rc))
    text = rc.read_text()
    assert text.startswith("#!/bin/sh\necho site-setup\n") and os.access(rc, os.X_OK)


def test_a_symlinked_rc_local_is_edited_through(tmp_path):
    real = tmp_path / "rc.d" / "rc.local"
    real.parent.mkdir()
    real.write_text("#!/bin/sh\nexit 0\n")
    os.chmod(real, 0o700)
    link = tmp_path / "rc.local"
    link.symlink_to(real)
    line = boothook.install(PY, AGENT, "/root/.gpujob", str(link))
    assert link.is_symlink() and os.readlink(link) == str(real)
    assert line in real.read_text() and os.stat(real).st_mode & 0o777 == 0o700
    assert boothook.remove("/root/.gpujob", str(link))
    assert link.is_symlink() and real.read_text() == "#!/bin/sh\nexit 0\n"
    assert sorted(p.name for p in real.parent.iterdir()) == ["rc.local"]  # no temp file left


def test_stop_removes_the_hook_fully(tmp_path):
    rc = tmp_path / "rc.local"
    before = "#!/bin/sh\n# site\n/usr/bin/site   # gpujob-boot /root/.gpujob is not ours\nexit 0\n"
    rc.write_text(before)
    boothook.install(PY, AGENT, "/root/.gpujob", str(rc))
    boothook.install(PY, AGENT + "2", "/root/.gpujob", str(rc))
    assert boothook.remove("/root/.gpujob", str(rc))
    assert rc.read_text() == before and "gpujob-boot" not in rc.read_text().replace(
        "# gpujob-boot /root/.gpujob is not ours", "")
    assert not boothook.remove("/root/.gpujob", str(rc))


def test_a_planted_symlink_never_makes_the_supervisor_write_through(tmp_path, monkeypatch):
    """The metrics textfile sits where node_exporter reads, often a directory other
    users write: the old temp name {textfile}.tmp{pid}, opened O_CREAT|O_TRUNC,
    followed a link planted under it and root overwrote the link's target."""
    victim = tmp_path / "shadow"
    victim.write_text("root-only\n")
    shared = tmp_path / "textfile.d"
    shared.mkdir()
    path = str(shared / "job.prom")
    monkeypatch.setattr(os, "getpid", lambda: 4242)
    for name in ("job.prom.tmp4242", "job.prom.tmp"):
        (shared / name).symlink_to(victim)
    (shared / "job.prom").symlink_to(victim)  # the textfile itself a link: replaced, not followed
    fsio.write_bytes(path, b"gpujob_up 1\n", mode=0o644, durable=False)
    assert victim.read_text() == "root-only\n"
    assert not os.path.islink(path) and open(path).read() == "gpujob_up 1\n"
    assert os.stat(path).st_mode & 0o777 == 0o644
    assert all(os.path.islink(shared / n) for n in os.listdir(shared) if n != "job.prom")


def test_the_metrics_writer_uses_the_safe_replace(tmp_path):
    class J:
        dir, job_id = str(tmp_path), "j-1"

        def state(self):
            return {"state": "running", "profile": "a"}

        def event(self, *a, **k):
            raise AssertionError((a, k))
    victim = tmp_path / "victim"
    victim.write_text("x")
    (tmp_path / f"m.prom.tmp{os.getpid()}").symlink_to(victim)
    w = metrics.MetricsFile(J(), {"spec": {"name": "n", "metrics": {"textfile": "m.prom"}}})
    w.write(force=True)
    assert victim.read_text() == "x" and "gpujob_state" in (tmp_path / "m.prom").read_text()


def test_a_webhook_redirect_is_a_failed_attempt_and_no_header_reaches_the_other_origin():
    import http.server
    import threading

    from gpujob.agent.supervisor import notify
    seen = {"other": [], "hook": []}

    def server(name, status, location=None):
        class H(http.server.BaseHTTPRequestHandler):
            def _any(self):
                seen[name].append((self.command, self.headers.get("Authorization")))
                self.send_response(status)
                if location:
                    self.send_header("Location", location)
                self.send_header("Content-Length", "0")
                self.end_headers()
            do_GET = do_POST = _any

            def log_message(self, *a):
                pass
        httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
        threading.Thread(target=httpd.serve_forever, daemon=True).start()
        return httpd, f"http://127.0.0.1:{httpd.server_address[1]}"
    other, other_url = server("other", 200)
    try:
        for code in (301, 302, 303, 307, 308):
            hook, hook_url = server("hook", code, other_url + "/steal")
            try:
                why = notify.post(hook_url + "/x", b"{}", {"Authorization": "Bearer tok-123"}, 5)
            finally:
                hook.shutdown()
            assert why == f"HTTP {code}: a redirect, not followed (a webhook URL must answer the POST itself)"
        assert seen["other"] == [] and len(seen["hook"]) == 5
    finally:
        other.shutdown()
