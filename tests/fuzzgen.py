"""Seeded mutants of the shipped specs and of a hosts.yaml, for tests/local/test_fuzz.py.

Each mutant is (class, bytes). Classes: types, delete, unknown, huge, unicode, nesting,
alias, garbage, empty, duplicate, tabs, newline_name, numbers, tags, encoding, truncate.
Everything here is pure and deterministic for a given ``random.Random``.
"""

from __future__ import annotations

import copy
import random

import yaml

from helpers import REPO

HOSTS = """\
hosts:
  pve1:
    address: 10.1.2.6
    port: 22
    user: root
    identity_file: ~/.ssh/id_ed25519
    known_hosts: ~/.ssh/known_hosts
    connect_timeout: 5
    keepalive: 15
    containers:
      ct200: {vmid: 200, gpus: 8}
      ct201: {vmid: 201, gpus: 8, home: /root/.gpujob}
  laptop:
    kind: local
    containers:
      box: {root: /tmp/gpujob-fuzz-root}
"""

SCALARS = [None, True, False, 0, -1, 1.5, 10**30, 10**400, -1e308, 1e308, float("nan"), ".inf", "",
           " ", "x" * 5000, "a\nb", "a\tb", "[/bold]", "[rank0]:", "{workdir}", "'{workdir}'",
           "\u202e\u0645rtl", "e\u0301", "😀" * 20, "\u2028", "\x1b[31mred", "1h99999999999m",
           "-5s", "1e400", "0x10", "12.8K", "==", "http://", "file:", "../../etc", "/"]
UNICODE = ["\u202e", "\u0000", "\u2028", "\ufeff", "😀", "\u0301", "\U0010ffff", "\x7f", "\x85", "Ω"]


def bases() -> dict[str, str]:
    return {"demo": (REPO / "jobs" / "demo.yaml").read_text(),
            "dflash": (REPO / "jobs" / "dflash.yaml").read_text(),
            "hosts": HOSTS}


def _paths(data, prefix=()):
    """Every (path, value) inside data."""
    yield prefix, data
    if isinstance(data, dict):
        for k, v in data.items():
            yield from _paths(v, prefix + (k,))
    elif isinstance(data, list):
        for i, v in enumerate(data):
            yield from _paths(v, prefix + (i,))


def _set(data, path, value):
    for part in path[:-1]:
        data = data[part]
    data[path[-1]] = value


def _data_mutant(rng: random.Random, data, kind: str) -> bytes:
    data = copy.deepcopy(data)
    paths = [p for p, _ in _paths(data) if p]
    path = rng.choice(paths)
    parent_path, last = path[:-1], path[-1]
    parent = data
    for part in parent_path:
        parent = parent[part]
    if kind == "types":
        _set(data, path, rng.choice(SCALARS + [[], {}, [1, "a"], {"a": 1}]))
    elif kind == "delete":
        if isinstance(parent, dict):
            del parent[last]
        else:
            parent.pop(last)
    elif kind == "unknown":
        target = parent if isinstance(parent, dict) else data
        target[rng.choice(["trian", "nmae", "x", "env2", "profiles ", "Target", "sync_", "gpus."])] = \
            rng.choice(SCALARS)
    elif kind == "huge":
        _set(data, path, rng.choice(["y" * 70_000, "z" * 1_000_000, 10**rng.randint(20, 4000),
                                     list(range(20_000)), {f"K{i}": i for i in range(3000)}]))
    elif kind == "unicode":
        value = parent[last]
        text = value if isinstance(value, str) else str(value)
        pos = rng.randint(0, len(text))
        _set(data, path, text[:pos] + rng.choice(UNICODE) + text[pos:])
    elif kind == "nesting":
        depth = rng.choice([3, 30, 45, 200, 600, 5000])
        if depth > 100:  # too deep for yaml.safe_dump itself: spliced in as text below
            deep = "".join(rng.choice("[{") for _ in range(depth))
            _set(data, path, "__DEEP__")
        else:
            value = parent[last]
            for _ in range(depth):
                value = [value] if rng.random() < 0.5 else {"k": value}
            _set(data, path, value)
    elif kind == "newline_name":
        if isinstance(parent, dict):
            parent[f"{last}\n{rng.choice(['x', 'evil: 1', '[/]'])}"] = parent.pop(last)
        else:
            _set(data, path, f"name\n{rng.choice(['x', 'two'])}")
    elif kind == "numbers":
        _set(data, path, rng.choice([10**30, 10**400, 1e308, -1, -10**30, 1023, 1024, 10_000, 10_001,
                                     365 * 86400, 365 * 86400 + 1, 0.0, -0.0, 2**63, 2**64]))
    text = yaml.safe_dump(data, sort_keys=False, allow_unicode=rng.random() < 0.5, width=10**6)
    if kind == "nesting" and depth > 100:
        closing = "".join("]" if c == "[" else "}" for c in reversed(deep))
        inner = "".join(c if c == "[" else "{k: " for c in deep)
        text = text.replace("__DEEP__", inner + "1" + closing, 1)
    return text.encode("utf-8", "surrogatepass")


BOMB = "a: &a [x,x,x,x,x,x,x,x,x,x]\n" + "".join(
    f"{n}: &{n} [{','.join(['*' + p] * 10)}]\n" for p, n in zip("abcdefgh", "bcdefghi"))


def _text_mutant(rng: random.Random, text: str, kind: str) -> bytes:
    lines = text.splitlines(keepends=True)
    i = rng.randrange(len(lines))
    if kind == "alias":
        choice = rng.randrange(5)
        if choice == 0:
            return (text + BOMB).encode()
        if choice == 1:
            return (text + "env: &r [*r]\n").encode()
        if choice == 2:
            return (text + "x: &m {<<: *m}\n").encode()
        if choice == 3:
            return (text + "y: *undefined\n").encode()
        return ("base: &b {name: x}\n" + text + "z: {<<: [*b, *b, 5]}\n").encode()
    if kind == "garbage":
        raw = bytearray(text.encode())
        for _ in range(rng.randint(1, 20)):
            raw.insert(rng.randrange(len(raw) + 1), rng.randrange(256))
        return bytes(raw)
    if kind == "empty":
        return rng.choice([b"", b"\n\n", b"# only a comment\n", b"---\n", b"---\n...\n", b"~\n", b"[]\n",
                           b"- a\n", b"x\n", b"{}\n"])
    if kind == "duplicate":
        lines.insert(i, lines[i])
        return "".join(lines).encode()
    if kind == "tabs":
        lines[i] = lines[i].replace("  ", "\t", 1) if rng.random() < 0.7 else lines[i].replace(": ", ":\t")
        return "".join(lines).encode()
    if kind == "tags":
        tag = rng.choice(["!!float 'x'", "!!int 'x'", "!!binary '###'", "!!timestamp 'x'",
                          "!!python/object:os.system 'ls'", "!!set {a, b}", "!!omap [a]", "!!str", "!x y",
                          "!!float '1e999'", "!!int '0b2'", "!!bool 'maybe'", "!!null 'x'"])
        head, sep, _ = lines[i].partition(": ")
        lines[i] = f"{head}: {tag}\n" if sep else f"{tag}: 1\n"
        return "".join(lines).encode()
    if kind == "encoding":
        return rng.choice([text.encode("utf-16"), text.encode("utf-16-le"), b"\xef\xbb\xbf" + text.encode(),
                           text.replace("\n", "\r\n").encode(),
                           text.encode("latin-1", "replace") + b"\xe9\xff",
                           text.encode()[:50] + b"\x00" + text.encode()[50:],
                           text.replace("\n", "\r").encode()])
    if kind == "truncate":
        cut = rng.randrange(len(text))
        return text[:cut].encode()
    raise ValueError(kind)


DATA_KINDS = ["types", "delete", "unknown", "huge", "unicode", "nesting", "newline_name", "numbers"]
TEXT_KINDS = ["alias", "garbage", "empty", "duplicate", "tabs", "tags", "encoding", "truncate"]


def mutants(seed: int, count: int) -> list[tuple[str, str, bytes]]:
    """``count`` (base, class, bytes) mutants, the same for the same seed."""
    rng = random.Random(seed)
    texts = bases()
    parsed = {name: yaml.safe_load(text) for name, text in texts.items()}
    out = []
    for n in range(count):
        base = rng.choice(["demo", "dflash", "hosts"])
        kind = rng.choice(DATA_KINDS + TEXT_KINDS)
        if kind in DATA_KINDS:
            body = _data_mutant(rng, parsed[base], kind)
        else:
            body = _text_mutant(rng, texts[base], kind)
        out.append((base, kind, body))
    return out
