import json
import textwrap

import pytest

from gpujob.errors import InputError, SpecError
from gpujob.spec.model import load_spec, spec_hash

# 7 lines; tests append below it, so their lines start at 8.
BASE = """\
name: demo
profiles:
  - name: cu128
    index_url: https://download.pytorch.org/whl/cu128
    packages: ["torch==2.11.0+cu128"]
train:
  command: python train.py
"""

EXAMPLE = """\
name: dflash
target: ct200
workdir: ~/work/dflash
sync:
  - src: ../SpecForge
    exclude: [".git", "__pycache__", "*.pyc"]
  - src: data
    dest: /data/in
env: {HF_HOME: /data/hf, NCCL_DEBUG: WARN, RETRIES: 3, FAST: yes}
gpus:
  target: [0, 1, 2, 3, 4]
  drafter: [5, 6, 7]
requirements: [transformers==4.57.1, datasets]
profiles:
  - &cu128
    name: cu128
    index_url: https://download.pytorch.org/whl/cu128
    extra_index_urls: []
    packages: ["torch==2.11.0+cu128", "torchvision==0.26.0+cu128"]
    requirements: null
    env: {}
    cuda: "12.8"
  - <<: *cu128
    name: cu130
    index_url: https://download.pytorch.org/whl/cu130
    packages: ["torch==2.11.0+cu130"]
    requirements: req-cu130.txt
    cuda: 13.0
profile: cu130
caches:
  per_profile: true
  clear_on_submit: false
warmup:
  command: python warmup.py
  per_gpu: drafter
  timeout: 30m
  when: cold
train:
  command: ["torchrun", "--nproc-per-node", "8", "train.py"]
  resume_args: "--resume --tag 'last good'"
  timeout: null
  grace: 30s
throughput:
  format: regex
  pattern: '(?P<value>[\\d.]+) (?P<unit>k?)tok/s'
  scope: per_gpu
  scope_group: target
  initial_delay: 1h30m
  initial_delay_samples: 2
  window: 5
  min: 12.8K
  min_ratio: 0.8
  failure_limit: 3
  no_data_timeout: 10m
  good_after: 600
rollback:
  enabled: true
  max_rollbacks: 2
  fallback: [cu128]
  on: [low_throughput, stall, error_signature, cuda_oom, gpu_idle]
  stop_on: [oom_killed, crash]
  gpu_idle: {group: drafter, below: 5, for: 5m}
"""


def write(tmp_path, text, name="job.yaml"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def error(tmp_path, text):
    """The one-line message load_spec gives, with the file called job.yaml."""
    path = write(tmp_path, text)
    with pytest.raises(SpecError) as info:
        load_spec(path)
    assert info.value.exit_code == 2
    return str(info.value).replace(str(path), "job.yaml")


def test_example_loads(tmp_path):
    (tmp_path / "req-cu130.txt").write_text("triton==3.5.0\n")
    spec = load_spec(write(tmp_path, EXAMPLE))
    assert spec.source_path == tmp_path / "job.yaml"
    assert spec.spec_dir == tmp_path
    assert spec.profile == "cu130"
    assert [s.dest for s in spec.sync] == ["SpecForge", "/data/in"]
    assert spec.sync[1].exclude == [".git", "__pycache__"]
    assert spec.env == {"HF_HOME": "/data/hf", "NCCL_DEBUG": "WARN", "RETRIES": "3", "FAST": "true"}
    cu130 = spec.profile_by_name("cu130")
    assert cu130.extra_index_urls == [] and cu130.cuda == "13.0"  # merged from cu128, own keys win
    assert cu130.packages == ["torch==2.11.0+cu130"]
    assert spec.warmup.timeout == 1800
    assert spec.train.resume_args == ["--resume", "--tag", "last good"]
    assert spec.throughput.min == 12800 and spec.throughput.initial_delay == 5400
    assert spec.throughput.good_after == 600
    assert spec.rollback.on[-1] == "gpu_idle"  # `on:` is a key, not YAML 1.1's boolean
    assert spec.rollback.gpu_idle.for_ == 300

    agent = json.loads(json.dumps(spec.to_agent_dict()))
    assert agent["rollback"]["gpu_idle"] == {"group": "drafter", "below": 5.0, "for": 300.0}
    assert agent["train"]["command"] == ["torchrun", "--nproc-per-node", "8", "train.py"]
    assert agent["warmup"]["command"] == "python warmup.py"
    assert agent["profiles"][1]["requirements_text"] == "triton==3.5.0\n"
    assert agent["profiles"][1]["env_key"] == spec.env_key("cu130")
    assert agent["profiles"][0]["requirements_text"] is None


def test_minimal_defaults(tmp_path):
    spec = load_spec(write(tmp_path, BASE))
    assert spec.profile == "cu128"
    assert spec.target is None and spec.workdir is None and spec.warmup is None and spec.throughput is None
    assert spec.sync == [] and spec.gpus == {} and spec.env == {}
    assert spec.caches.per_profile and not spec.caches.clear_on_submit
    assert spec.train.resume_args == [] and spec.train.grace == 30 and spec.train.timeout is None
    assert spec.rollback.enabled and spec.rollback.max_rollbacks == 2
    assert spec.rollback.on == ["low_throughput", "stall", "error_signature", "cuda_oom", "start_hang",
                                "compile_race"]
    assert spec.rollback.stop_on == [] and spec.train.restarts is None
    assert spec.rollback.error_signatures == ["is_fx_symbolic_tracing",
                                              "Detected that you are using FX to symbolically trace"]


def test_throughput_defaults(tmp_path):
    spec = load_spec(write(tmp_path, BASE + "throughput: {format: ktok, min_ratio: 0.5}\n"))
    t = spec.throughput
    assert (t.scope, t.window, t.failure_limit, t.initial_delay, t.no_data_timeout, t.good_after) == \
        ("total", "10s", "20s", 0, 600, 600)  # chosen from the corpus: docs/rollback.md
    assert t.min is None and t.min_ratio == 0.5


@pytest.mark.parametrize("text, seconds", [
    ("90", 90), ("1.5", 1.5), ("'90s'", 90), ("10m", 600), ("2h", 7200), ("1h30m", 5400),
    ("1h0m30s", 3630),
])
def test_durations(tmp_path, text, seconds):
    spec = load_spec(write(tmp_path, BASE.replace("python train.py", f"x\n  grace: {text}")))
    assert spec.train.grace == seconds


@pytest.mark.parametrize("text, rate", [("10000", 10000), ("10K", 10000), ("12.8K", 12800), ("1.2M", 1200000),
                                        ("2.5k", 2500), ("'300'", 300)])
def test_rates(tmp_path, text, rate):
    spec = load_spec(write(tmp_path, BASE + f"throughput: {{format: ktok, min: {text}}}\n"))
    assert spec.throughput.min == pytest.approx(rate)


def test_env_key(tmp_path):
    (tmp_path / "req.txt").write_text("triton==3.5.0\n")
    text = BASE.replace('"]\n', '"]\n    requirements: req.txt\n', 1)
    spec = load_spec(write(tmp_path, text))
    key = spec.env_key("cu128")
    assert key.startswith("cu128-") and len(key) == len("cu128-") + 12
    (tmp_path / "req.txt").write_text("triton==3.4.0\n")
    assert spec.env_key("cu128") != key  # the requirements file's content counts
    (tmp_path / "req.txt").write_text("triton==3.5.0\n")
    assert spec.env_key("cu128") == key
    common = load_spec(write(tmp_path, text + "requirements: [datasets]\n"))
    assert common.env_key("cu128") != key  # so do the job's common requirements
    env = load_spec(write(tmp_path,
                          text.replace("requirements: req.txt", "requirements: req.txt\n    env: {A: b}")))
    assert env.env_key("cu128") == key  # a profile's env does not go into its venv


def test_spec_hash(tmp_path):
    first = spec_hash(load_spec(write(tmp_path, BASE)))
    assert len(first) == 16 and int(first, 16) >= 0
    assert spec_hash(load_spec(write(tmp_path, BASE))) == first
    assert spec_hash(load_spec(write(tmp_path, BASE.replace("python train.py", "python t2.py")))) != first


def test_profile_by_name(tmp_path):
    spec = load_spec(write(tmp_path, BASE))
    assert spec.profile_by_name("cu128").name == "cu128"
    with pytest.raises(InputError,
                       match=r"^unknown profile 'cu129'; profiles: cu128 \(did you mean 'cu128'\?\)$"):
        spec.profile_by_name("cu129")


@pytest.mark.parametrize("text, message", [
    # not YAML / not a mapping
    ("name: [a\n",
     "job.yaml:2: not valid YAML: while parsing a flow sequence, did not find expected ',' or ']'"),
    ("a: 1\n---\nb: 2\n",
     "job.yaml:2: not valid YAML: expected a single document in the stream, but found another document"),
    ("- a\n- b\n", "job.yaml:1: expected a mapping at the top level, got a list"),
    ("just words\n", "job.yaml:1: expected a mapping at the top level, got 'just words'"),
    ("", "job.yaml:1: empty file; expected a YAML mapping"),
    ("# nothing here\n", "job.yaml:1: empty file; expected a YAML mapping"),
    (BASE + "t: !custom 1\n",
     "job.yaml:8: not valid YAML: could not determine a constructor for the tag '!custom'"),
    # duplicate keys
    (BASE + "env:\n  FOO: 1\n  BAR: 2\n  FOO: 3\n", "job.yaml:11: env: duplicate key 'FOO'"),
    (BASE + "name: again\n", "job.yaml:8: duplicate key 'name'"),
    # wrong types
    (BASE.replace("name: demo", "name: 5"), "job.yaml:1: name: expected a string, got 5"),
    (BASE.replace("name: demo", "name: Demo_1"),
     "job.yaml:1: name: expected a name matching [a-z0-9][a-z0-9-]{0,39}, got 'Demo_1'"),
    (BASE.replace("train:\n  command: python train.py", "train: python train.py"),
     "job.yaml:6: train: expected a mapping, got 'python train.py'"),
    (BASE.replace("command: python train.py", "command: []"),
     "job.yaml:7: train.command: expected a command (a string or a list of strings), got a list"),
    ("name: demo\nprofiles: {}\ntrain: {command: x}\n",
     "job.yaml:2: profiles: expected a list, got a mapping"),
    (BASE + "gpus: {target: abc}\n", "job.yaml:8: gpus.target: expected a list of GPU indices, got 'abc'"),
    (BASE + "gpus:\n  target: [0, x]\n",
     "job.yaml:9: gpus.target[1]: expected a GPU index (an integer from 0 to 1023), got 'x'"),
    (BASE + "gpus:\n  target: [0, -1]\n",
     "job.yaml:9: gpus.target[1]: expected a GPU index (an integer from 0 to 1023), got -1"),
    (BASE + "gpus:\n  Target: [0]\n",
     "job.yaml:9: gpus.Target: expected a name matching [a-z_][a-z0-9_]*, got 'Target'"),
    (BASE + "caches: {per_profile: 'yes'}\n",
     "job.yaml:8: caches.per_profile: expected true or false, got 'yes'"),
    (BASE + "env:\n  BAD-NAME: 1\n",
     "job.yaml:9: env.BAD-NAME: expected a name matching [A-Za-z_][A-Za-z0-9_]*, got 'BAD-NAME'"),
    (BASE + "env:\n  X: [1]\n", "job.yaml:9: env.X: expected a string, number or boolean, got a list"),
    (BASE + "throughput:\n  format: ktok\n  min: fast\n",
     "job.yaml:10: throughput.min: expected a number, got 'fast'"),
    (BASE + "throughput:\n  format: ktok\n  min: 0\n", "job.yaml:10: throughput.min: must be > 0, got 0"),
    (BASE + "throughput:\n  format: kt0k\n  min: 1\n",
     "job.yaml:9: throughput.format: expected one of ktok, torchtitan, tqdm, tqdm_steps, hf, regex, got "
     "'kt0k'"),
    (BASE + "throughput:\n  format: ktok\n  min: 1\n  window: '5'\n",
     "job.yaml:11: throughput.window: expected a count (an integer) or a duration with a unit like 60s, got "
     "'5'"),
    (BASE + "throughput:\n  format: ktok\n  min: 1\n  window: 0\n",
     "job.yaml:11: throughput.window: expected a count from 1 to 10000, got 0"),
    (BASE + "throughput:\n  format: ktok\n  min: 1\n  good_after: 5s\n",
     "job.yaml:11: throughput.good_after: expected at least the window (10s): a profile is proven known-good "
     "over a span that holds one full window, so 5s never proves one"),
    (BASE + "throughput:\n  format: ktok\n  min: 1\n  window: 1m\n  good_after: 30s\n",
     "job.yaml:12: throughput.good_after: expected at least the window (60s): a profile is proven known-good "
     "over a span that holds one full window, so 30s never proves one"),
    (BASE + "throughput:\n  format: ktok\n  min_ratio: 1.5\n",
     "job.yaml:10: throughput.min_ratio: must be <= 1, got 1.5"),
    (BASE + "rollback:\n  on: [explode]\n",
     "job.yaml:9: rollback.on[0]: expected one of low_throughput, stall, error_signature, cuda_oom, "
     "oom_killed, crash, gpu_idle, nccl_timeout, hw_error, driver_mismatch, start_hang, compile_race, got "
     "'explode'"),
    (BASE + "rollback:\n  max_rollbacks: 1.5\n",
     "job.yaml:9: rollback.max_rollbacks: expected an integer, got 1.5"),
    (BASE.replace("command: python train.py", "command: x\n  resume_args: \"--tag 'open\""),
     "job.yaml:8: train.resume_args: cannot split \"--tag 'open\" into arguments: No closing quotation"),
    # missing fields
    (BASE.replace("train:\n  command: python train.py\n", ""), "job.yaml:1: train: missing (required)"),
    (BASE.replace("command: python train.py", "grace: 1s"), "job.yaml:6: train.command: missing (required)"),
    (BASE.replace("  - name: cu128\n    index_url", "  - index_url"),
     "job.yaml:3: profiles[0].name: missing (required)"),
    # unknown keys
    (BASE + "throughput:\n  format: ktok\n  windw: 3\n  min: 1\n",
     "job.yaml:10: throughput.windw: unknown field; did you mean 'window'?"),
    (BASE + "flavour: spicy\n", "job.yaml:8: flavour: unknown field"),
    (BASE.replace("  - name: cu128", "  - nam: cu128"),
     "job.yaml:3: profiles[0].nam: unknown field; did you mean 'name'?"),
    # profiles
    (BASE.replace("torch==2.11.0+cu128", "torch>=2"),
     "job.yaml:5: profiles[0].packages[0]: expected a pinned requirement like torch==2.11.0+cu128, got "
     "'torch>=2'"),
    (BASE.replace('["torch==2.11.0+cu128"]', '["torch==2.11.0+cu128", torchvision]'),
     "job.yaml:5: profiles[0].packages[1]: expected a pinned requirement like torch==2.11.0+cu128, got "
     "'torchvision'"),
    (BASE.replace('["torch==2.11.0+cu128"]', "[]"),
     "job.yaml:5: profiles[0].packages: expected at least one pinned package "
     "(or system_site_packages: true to use the base interpreter's)"),
    (BASE.replace("    index_url: https://download.pytorch.org/whl/cu128\n", ""),
     "job.yaml:3: profiles[0].index_url: missing (required when the profile installs packages)"),
    (BASE.replace('"]\n', '"]\n    python: ""\n', 1),
     "job.yaml:6: profiles[0].python: expected an interpreter path or name like /opt/torch/bin/python3, got "
     "''"),
    (BASE.replace('"]\n', '"]\n    system_site_packages: 1\n', 1),
     "job.yaml:6: profiles[0].system_site_packages: expected true or false, got 1"),
    ("name: demo\nprofiles: []\ntrain: {command: x}\n", "job.yaml:2: profiles: must not be empty"),
    (BASE.replace("https://", "ftp://"),
     "job.yaml:4: profiles[0].index_url: expected an http(s):// or file: URL, "
                                         "got 'ftp://download.pytorch.org/whl/cu128'"),
    (BASE.replace('"]\n', '"]\n    find_links: [/opt/wheels]\n', 1),
     "job.yaml:6: profiles[0].find_links[0]: expected an http(s):// or file: URL, got '/opt/wheels'"),
    (BASE.replace('"]\n', '"]\n    cuda: "12"\n', 1),
     "job.yaml:6: profiles[0].cuda: expected a CUDA version like \"12.8\", got '12'"),
    (BASE.replace('"]\n', '"]\n    requirements: missing.txt\n', 1),
     "job.yaml:6: profiles[0].requirements: no such file: "
                                                                      "TMP/missing.txt"),
    (BASE.replace("train:", "  - name: cu128\n    index_url: https://x\n    packages: [a==1]\ntrain:"),
     "job.yaml:6: profiles[1].name: duplicate profile name 'cu128'"),
    (BASE + "profile: cu999\n", "job.yaml:8: profile: 'cu999' is not a profile; profiles: cu128"),
    # durations
    (BASE.replace("python train.py", "x\n  grace: soon"),
     "job.yaml:8: train.grace: expected a duration like 90s, 10m or 1h30m, got 'soon'"),
    (BASE.replace("python train.py", "x\n  timeout: -5"),
     "job.yaml:8: train.timeout: expected a duration like 90s, 10m or 1h30m, got -5"),
    (BASE.replace("python train.py", "x\n  grace: '45'"),
     "job.yaml:8: train.grace: expected a duration like 90s, 10m or 1h30m, got '45'"),
    (BASE.replace("python train.py", "x\n  timeout: 1h30"),
     "job.yaml:8: train.timeout: expected a duration like 90s, 10m or 1h30m, got '1h30'"),
    # throughput formats
    (BASE + "throughput:\n  format: ktok\n", "job.yaml:8: throughput: needs min, min_ratio or both"),
    (BASE + "throughput:\n  format: regex\n  min: 1\n",
     "job.yaml:8: throughput.pattern: missing (required) for format regex"),
    (BASE + "throughput:\n  format: regex\n  pattern: '(?P<value>\\d+'\n  min: 1\n",
     "job.yaml:10: throughput.pattern: not a valid regex: missing ), unterminated subpattern at position 0"),
    (BASE + "throughput:\n  format: regex\n  pattern: '(\\d+) tok/s'\n  min: 1\n",
     "job.yaml:10: throughput.pattern: needs one named group (?P<value>...) (a rate), (?P<ms>...) or "
     "(?P<seconds>...) (time per step)"),
    (BASE + "throughput:\n  format: ktok\n  pattern: '(?P<value>\\d+)'\n  min: 1\n",
     "job.yaml:10: throughput.pattern: only for format regex"),
    (BASE + "throughput:\n  format: tqdm\n  min: 1\n",
     "job.yaml:8: throughput.tokens_per_step: missing (required) for format tqdm"),
    (BASE + "throughput:\n  format: tqdm\n  tokens_per_step: 0\n  min: 1\n",
     "job.yaml:10: throughput.tokens_per_step: must be > 0, got 0"),
    (BASE + "throughput:\n  format: ktok\n  scope_group: target\n  min: 1\n",
     "job.yaml:10: throughput.scope_group: only for scope per_gpu"),
    # GPU groups
    (BASE + "gpus:\n  target: [0, 1]\n  drafter: [2, 1]\n",
     "job.yaml:10: gpus.drafter[1]: GPU 1 is already in group 'target'"),
    (BASE + "gpus:\n  target: [0, 0]\n", "job.yaml:9: gpus.target[1]: GPU 0 is listed twice"),
    (BASE + "gpus: {drafter: [1]}\nwarmup:\n  command: x\n  per_gpu: drafterz\n",
     "job.yaml:11: warmup.per_gpu: no GPU group 'drafterz' in gpus (did you mean 'drafter'?)"),
    (BASE + "warmup:\n  command: x\n  per_gpu: drafter\n",
     "job.yaml:10: warmup.per_gpu: no GPU group 'drafter' in gpus (gpus defines no groups)"),
    (BASE + "gpus: {drafter: [1]}\nthroughput: {format: ktok, min: 1, scope: per_gpu, scope_group: x}\n",
     "job.yaml:9: throughput.scope_group: no GPU group 'x' in gpus"),
    # rollback
    (BASE + "rollback:\n  fallback: [cu128, cu130]\n",
     "job.yaml:9: rollback.fallback[1]: 'cu130' is not a profile; profiles: cu128"),
    (BASE + "rollback:\n  stop_on: [crash, stall]\n",
     "job.yaml:9: rollback.stop_on[1]: 'stall' is also in rollback.on"),
    (BASE.replace("train:\n", "train:\n  restarts: {on: [crash, driver_mismatch]}\n"),
     "job.yaml:7: train.restarts.on[1]: 'driver_mismatch' cannot be fixed by a restart on the same wheels"),
    (BASE.replace("train:\n", "train:\n  restarts: {max: 2}\n") + "rollback:\n  stop_on: [hw_error]\n",
     "job.yaml:7: train.restarts.on[2]: 'hw_error' is also in rollback.stop_on"),
    (BASE + "rollback:\n  on: [gpu_idle]\n",
     "job.yaml:8: rollback: the gpu_idle signal needs a gpu_idle block"),
    (BASE + "rollback:\n  gpu_idle: {below: 5}\n",
     "job.yaml:9: rollback.gpu_idle: 'gpu_idle' is in neither rollback.on nor rollback.stop_on"),
    (BASE + "rollback:\n  on: [gpu_idle]\n  gpu_idle: {below: 500}\n",
     "job.yaml:10: rollback.gpu_idle.below: must be <= 100, got 500"),
    (BASE + "rollback:\n  wait_for_checkpoint: true\n",
     "job.yaml:9: rollback.wait_for_checkpoint: needs train.checkpoint (path and every)"),
    (BASE.replace("python train.py", "x\n  checkpoint: {path: 'c/*.pt', every: 0}"),
     "job.yaml:8: train.checkpoint.every: expected a duration > 0"),
    (BASE.replace("python train.py", "x\n  checkpoint: {path: 'c/*.pt'}"),
     "job.yaml:8: train.checkpoint.every: missing (required)"),
    # checkpoint globs that could reach anything (issue 24): refused in one line
    (BASE.replace("python train.py", "x\n  checkpoint: {path: '/*', every: 1m}"),
     "job.yaml:8: train.checkpoint.path: '/*' refused: it names the container's root '/' (every system "
     "directory would match)"),
    (BASE.replace("python train.py", "x\n  checkpoint: {path: '../../../root/other/*', every: 1m}"),
     "job.yaml:8: train.checkpoint.path: '../../../root/other/*' refused: a component is '..': it escapes "
     "the directory it names; give an absolute path instead"),
    (BASE.replace("python train.py", "x\n  checkpoint: {path: '/etc/ssh/*.pt', every: 1m}"),
     "job.yaml:8: train.checkpoint.path: '/etc/ssh/*.pt' refused: it is under /etc, a system directory"),
    (BASE.replace("python train.py", "x\n  checkpoint: {path: '/root/*', every: 1m}"),
     "job.yaml:8: train.checkpoint.path: '/root/*' refused: it names /root itself; name a directory under "
     "it"),
    (BASE.replace("name: demo", "name: demo\nworkdir: /").replace(
        "python train.py", "x\n  checkpoint: {path: '*', every: 1m}"),
     "job.yaml:9: train.checkpoint.path: '*' in workdir '/' refused: it names the container's root '/' "
     "(every system directory would match)"),
    (BASE.replace("python train.py", "x\n  checkpoint: {path: 'c/*', every: 1m, done_file: a/b}"),
     "job.yaml:8: train.checkpoint.done_file: expected a file name like trainer_state.json, got 'a/b'"),
    (BASE.replace("python train.py", "x\n  resume_args: ['--from', '{resume_from}']"),
     "job.yaml:8: train.resume_args[1]: {resume_from} needs train.checkpoint (path and every): gpujob fills "
     "it with the checkpoint this job wrote"),
    (BASE.replace("python train.py", "python train.py --from {resume_from}"),
     "job.yaml:7: train.command: {resume_from} is only for train.resume_args (the arguments of a resumed "
     "trainer)"),
    # sync
    (BASE + "sync:\n  - dest: x\n", "job.yaml:9: sync[0].src: missing (required)"),
    (BASE + "sync:\n  - src: /\n",
     "job.yaml:9: sync[0].dest: missing (required): cannot be derived from src '/'"),
    # several problems: the first in the file is reported
    (BASE.replace("name: demo", "name: demo\nworkdir: 5") + "gpus: {target: x}\n",
     "job.yaml:2: workdir: expected a string, got 5"),
])
def test_broken(tmp_path, text, message):
    assert error(tmp_path, text) == message.replace("TMP", str(tmp_path))


def test_unreadable(tmp_path):
    with pytest.raises(SpecError, match=r"nope\.yaml: cannot read: No such file or directory$"):
        load_spec(tmp_path / "nope.yaml")


def test_stall_detection_off_and_regex_steps_scaled(tmp_path):
    spec = load_spec(write(tmp_path,
                           BASE + "throughput:\n  format: regex\n  pattern: '(?P<value>[0-9.]+) steps/s'\n"
                                            "  tokens_per_step: 4096\n  min: 10K\n  no_data_timeout: null\n"))
    assert spec.throughput.no_data_timeout is None and spec.throughput.tokens_per_step == 4096
    assert error(tmp_path, BASE + "throughput:\n  format: ktok\n  min: 1\n  no_data_timeout: 0\n") == \
        "job.yaml:11: throughput.no_data_timeout: expected a duration > 0 " \
        "(or null to turn stall detection off)"
    assert error(tmp_path, BASE + "throughput:\n  format: hf\n  min: 1\n  tokens_per_step: 8\n") == \
        "job.yaml:11: throughput.tokens_per_step: only for format tqdm or tqdm_steps or regex"


def test_base_interpreter_profile_needs_no_packages_and_has_its_own_key(tmp_path):
    text = BASE.replace("    index_url: https://download.pytorch.org/whl/cu128\n    packages: "
                        "[\"torch==2.11.0+cu128\"]\n",
                        "    python: /opt/torch/.venv/bin/python3\n    system_site_packages: true\n    cuda: "
                        "'13.0'\n")
    spec = load_spec(write(tmp_path, text))
    prof = spec.profiles[0]
    assert prof.packages == [] and prof.index_url is None and prof.system_site_packages
    other = load_spec(write(tmp_path, text.replace("/opt/torch/.venv", "/opt/other"), "b.yaml"))
    assert spec.env_key("cu128") != other.env_key("cu128")  # another base, another venv


def test_find_links_have_their_own_key_and_leave_older_keys_alone(tmp_path):
    plain = load_spec(write(tmp_path, BASE)).env_key("cu128")
    empty = load_spec(write(tmp_path, BASE.replace('"]\n', '"]\n    find_links: []\n', 1), "b.yaml"))
    assert empty.env_key("cu128") == plain
    flat = load_spec(write(tmp_path, BASE.replace('"]\n', '"]\n    find_links: ["file:///opt/wheels"]\n', 1),
                           "c.yaml"))
    assert flat.profiles[0].find_links == ["file:///opt/wheels"] and flat.env_key("cu128") != plain


def test_the_agents_spec_defaults_are_generated_from_spec_py():
    """Defaults live in spec.py only; the agent's copy (for a job.json of an older
    gpujob that lacks a key) is generated from it."""
    from pathlib import Path

    import gpujob.spec.model as s
    from gpujob.agent.base.defaults import DEFAULTS, section
    from gpujob.spec.defaults import agent_defaults_json
    shipped = Path(s.__file__).parent.parent / "agent" / "base" / "spec_defaults.json"
    assert shipped.read_text() == agent_defaults_json(), \
        "regenerate: python -m gpujob.spec.defaults > gpujob/agent/base/spec_defaults.json"
    assert DEFAULTS["throughput"]["window"] == s.Throughput.model_fields["window"].default
    assert section({"rollback": {"max_rollbacks": 7}}, "rollback")["max_rollbacks"] == 7
    assert section({"rollback": {}}, "rollback")["signature_grace"] == s.Rollback().signature_grace
    assert section({}, "throughput") is None and section({}, "journal") == DEFAULTS["journal"]
