# run a command with stdout/stderr a pipe (not a tty) and record each line ('\r' or '\n' ends one)
# with its read time, as gpujob's trace format v1 records output
import gzip, json, os, subprocess, sys, time
out, profile, resume, cmd = sys.argv[1], sys.argv[2], sys.argv[3] == "1", sys.argv[4:]
recs = [{"trace": 1, "name": "lightning-cpu", "recorded_by": "tests/data/lightning/README.md's recorder",
         "meta": {"throughput": {"format": "tqdm_steps", "tokens_per_step": 32}}},
        {"t": round(time.time(), 3), "run": {"profile": profile, "phase": "train", "resume": resume}}]
p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=os.path.dirname(__file__))
buf = b""
while True:
    chunk = os.read(p.stdout.fileno(), 65536)
    if not chunk:
        break
    t = round(time.time(), 3)
    buf += chunk
    parts = buf.replace(b"\r\n", b"\n").replace(b"\r", b"\n").split(b"\n")
    buf = parts.pop()
    for ln in parts:
        recs.append({"t": t, "out": ln.decode("utf-8", "replace")})
rc = p.wait()
recs.append({"t": round(time.time(), 3), "exit": rc})
with gzip.open(out, "wt") as f:
    for r in recs:
        f.write(json.dumps(r) + "\n")
print(out, len(recs), rc)
