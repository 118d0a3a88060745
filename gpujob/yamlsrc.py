"""Line-aware YAML loading and one-line validation errors.

`load_yaml` keeps the 1-based line of every value; `Source.validate` runs a
pydantic model over the data and turns the first problem into a `SpecError`
(`path:line: field: message`) with the best line it knows.
"""

from __future__ import annotations

import difflib
import re
from pathlib import Path
from typing import Any, Mapping, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError, model_validator
from yaml.events import (AliasEvent, CollectionEndEvent, MappingStartEvent, ScalarEvent,
                         SequenceStartEvent)
from yaml.nodes import MappingNode, ScalarNode, SequenceNode

from gpujob.errors import SpecError, one_line

_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_BOOL = "tag:yaml.org,2002:bool"
_MERGE = "tag:yaml.org,2002:merge"

Loc = tuple[Any, ...]
M = TypeVar("M", bound=BaseModel)


class At(ValueError):
    """Raised inside a validator: `message` about `loc`, relative to the model validated."""

    def __init__(self, loc: Loc, message: str):
        super().__init__(message)
        self.loc = tuple(loc)


#: Bounds on what a spec or inventory file may hold (each far above any real file).
MAX_FILE_BYTES = 1 << 20
MAX_DEPTH = 40
MAX_ALIASES = 200
MAX_NODES = 50_000  # values after expanding aliases
MAX_KEYS = 2_000  # keys of one mapping
MAX_SCALAR = 64 * 1024  # characters of one value
SHOW = 60  # characters of a value quoted in an error


def shorten(text: str, limit: int = SHOW) -> str:
    """``text`` escaped onto one line (repr-style) and cut to about ``limit`` characters."""
    if len(text) > limit:
        text = text[:limit] + f"… ({len(text)} chars)"
    return one_line(text)


def describe(value: Any) -> str:
    """A value as the user wrote it, for 'got ...': one line, shortened."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        cut = value if len(value) <= SHOW else value[:SHOW] + "…"
        return repr(cut) + (f" ({len(value)} chars)" if len(value) > SHOW else "")
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    return shorten(str(value))


def kind_of(value: Any) -> str:
    """What a value is, never what it says (for values that may be secrets)."""
    if isinstance(value, (dict, list)) or value is None or isinstance(value, bool):
        return describe(value)
    return {str: "a string", int: "an integer", float: "a number"}.get(type(value), "a value")


def suggest(word: str, choices) -> str:
    """' (did you mean 'x'?)' when something in choices is close, else ''."""
    close = difflib.get_close_matches(str(word), [str(c) for c in choices], n=1)
    return f" (did you mean '{close[0]}'?)" if close else ""


_PLAIN_KEY = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9_.-]{0,59}")


def render_loc(loc: Loc) -> str:
    """('profiles', 1, 'packages', 0) -> 'profiles[1].packages[0]'; an odd key (a
    newline, a space, 300 characters) is quoted: env['A\\nB']."""
    out = ""
    for part in loc:
        if isinstance(part, int) and not isinstance(part, bool):
            out += f"[{part}]"
        elif isinstance(part, str) and _PLAIN_KEY.fullmatch(part):
            out += f".{part}" if out else part
        else:
            out += f"[{describe(part)}]"
    return out


def is_secret_loc(loc: Loc) -> bool:
    """Values under `env` (of the job or of a profile) may be secrets: never echoed."""
    loc = tuple(loc)
    return loc[:1] == ("env",) or (loc[:1] == ("profiles",) and loc[2:3] == ("env",))


_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def control_char(text: str):
    """The first control character in ``text`` as it would be written in Python
    (``'\\n'``), or None. Paths and names that reach the container (a shell, a boot
    file, a file name) never hold one: a newline would end the line they sit in."""
    found = _CONTROL.search(text)
    return ascii(found.group())[1:-1] if found else None


class Strict(BaseModel):
    """Base of every spec/inventory model: strict types, unknown keys are errors."""

    model_config = ConfigDict(strict=True, extra="forbid", allow_inf_nan=False)

    @model_validator(mode="before")
    @classmethod
    def _known_keys(cls, data: Any) -> Any:
        if isinstance(data, dict):
            names = [field.alias or name for name, field in cls.model_fields.items()]
            for key in data:
                if key not in names:
                    close = difflib.get_close_matches(str(key), names, n=1)
                    hint = f"; did you mean '{close[0]}'?" if close else ""
                    raise At((key,), "unknown field" + hint)
        return data


def _plain(number: Any) -> Any:
    """100.0 -> 100, for bounds and the numbers checked against them."""
    return int(number) if isinstance(number, float) and number.is_integer() else number


def _message(err: Mapping[str, Any], secret: bool = False) -> str:
    """A human message from a pydantic error's type, ctx and input (only its kind
    when ``secret``)."""
    kind, ctx = err["type"], err.get("ctx", {})
    got = (kind_of if secret else describe)(err.get("input"))
    if kind == "value_error":  # our validators' own messages
        return str(ctx["error"])
    if kind == "missing":
        return "missing (required)"
    if kind == "literal_error":
        choices = re.findall(r"'([^']*)'", ctx["expected"])
        return f"expected one of {', '.join(choices)}, got {got}"
    if kind == "too_short":
        return "must not be empty" if ctx["min_length"] == 1 else f"needs at least {ctx['min_length']} items"
    if kind == "string_pattern_mismatch":
        return f"expected a name matching {ctx['pattern'].strip('^$')}, got {got}"
    bounds = {"greater_than": ">", "greater_than_equal": ">=", "less_than": "<", "less_than_equal": "<="}
    if kind in bounds:
        limit, value = (_plain(v) for v in (next(iter(ctx.values())), err.get("input")))
        return f"must be {bounds[kind]} {limit}, got {got if secret else describe(value)}"
    if kind == "finite_number":
        return f"expected a finite number, got {got}"
    expected = {
        "int_type": "an integer", "float_type": "a number", "string_type": "a string",
        "bool_type": "true or false", "list_type": "a list", "dict_type": "a mapping",
        "model_type": "a mapping",
    }
    return f"expected {expected[kind]}, got {got}" if kind in expected else f"invalid value {got}"


class Source:
    """Data loaded from one YAML file, with the line of every value."""

    def __init__(self, path: str, data: dict, lines: dict[Loc, int]):
        self.path = path
        self.data = data
        self.lines = lines

    def line(self, loc: Loc) -> int:
        """The line of loc's value, else of its nearest existing parent."""
        loc = tuple(loc)
        while loc not in self.lines:
            loc = loc[:-1]
        return self.lines[loc]

    def error(self, loc: Loc, message: str) -> SpecError:
        return SpecError(self.path, self.line(loc), render_loc(loc) or None, message)

    def from_validation(self, exc: ValidationError) -> SpecError:
        """The problem earliest in the file, as one SpecError."""
        problems = []
        for err in exc.errors():
            loc = tuple(part for part in err["loc"] if part != "[key]")
            cause = err.get("ctx", {}).get("error")
            if isinstance(cause, At):
                loc += cause.loc
            secret = is_secret_loc(loc) and "[key]" not in err["loc"]  # a key is a name, not a secret
            problems.append((loc, _message(err, secret=secret)))
        loc, message = min(problems, key=lambda p: self.line(p[0]))
        return self.error(loc, message)

    def validate(self, model: type[M], context: dict | None = None) -> M:
        try:
            return model.model_validate(self.data, context=context)
        except ValidationError as exc:
            raise self.from_validation(exc) from None


class _Builder:
    def __init__(self, path: str, loader):
        self.path = path
        self.loader = loader
        self.lines: dict[Loc, int] = {}

    def construct(self, node, loc: Loc) -> Any:
        """A scalar's value; a bad tagged value (`!!float 'x'`) is a SpecError."""
        try:
            return self.loader.construct_object(node, deep=True)
        except yaml.YAMLError:
            raise
        except Exception as exc:  # noqa: BLE001 - PyYAML's constructors raise KeyError, AttributeError, ...
            what = f"{node.tag.rsplit(':', 1)[-1]} value" if node.tag else "value"
            shown = "" if is_secret_loc(loc) else f" {describe(node.value)}"
            raise SpecError(self.path, node.start_mark.line + 1, render_loc(loc) or None,
                            f"cannot read the {what}{shown}: {shorten(type(exc).__name__)}") from None

    def build(self, node, loc: Loc, key_line: int | None = None) -> Any:
        value: Any
        if isinstance(node, MappingNode):
            value = self._mapping(node, loc)
        elif isinstance(node, SequenceNode):
            value = [self.build(item, loc + (i,)) for i, item in enumerate(node.value)]
        else:
            value = self.construct(node, loc)
        # Collections point at their key; scalars at themselves.
        scalar = isinstance(node, ScalarNode)
        self.lines[loc] = key_line if key_line and not scalar else node.start_mark.line + 1
        return value

    def _mapping(self, node: MappingNode, loc: Loc) -> dict:
        field = render_loc(loc) or None
        out: dict = {}
        # `<<: *base` first (the earliest merged mapping wins), so that own keys override.
        for key_node, value_node in node.value:
            if key_node.tag == _MERGE:
                merged = value_node.value if isinstance(value_node, SequenceNode) else [value_node]
                for part in reversed(merged):
                    if not isinstance(part, MappingNode):
                        raise SpecError(self.path, key_node.start_mark.line + 1, field,
                                        "'<<' needs a mapping")
                    out.update(self._mapping(part, loc))
        own: set = set()
        for key_node, value_node in node.value:
            line = key_node.start_mark.line + 1
            if key_node.tag == _MERGE:
                continue
            if not isinstance(key_node, ScalarNode):
                raise SpecError(self.path, line, field, "keys must be plain scalars")
            # YAML 1.1 reads `on:`/`yes:` keys as booleans; keep them as written.
            key = key_node.value if key_node.tag == _BOOL else self.construct(key_node, loc)
            if key in own:
                raise SpecError(self.path, line, field, f"duplicate key {describe(key)}")
            own.add(key)
            out[key] = self.build(value_node, loc + (key,), line)
        return out


def _line_at(text: str, index: int) -> int:
    return text.count("\n", 0, max(index, 0)) + 1


def _decode(name: str, raw: bytes) -> str:
    """UTF-8 text, or a SpecError with the line of the first bad byte."""
    if not raw.strip():
        raise SpecError(name, 1, None, "empty file; expected a YAML mapping")
    if raw.startswith((b"\xff\xfe", b"\xfe\xff")) or (len(raw) > 1 and b"\x00" in raw[:2]):
        raise SpecError(name, 1, None, "not UTF-8 (it looks like UTF-16); save the file as UTF-8")
    nul = raw.find(b"\x00")
    if nul >= 0:
        raise SpecError(name, raw.count(b"\n", 0, nul) + 1, None, "a NUL byte; expected UTF-8 text")
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise SpecError(name, raw.count(b"\n", 0, exc.start) + 1, None,
                        f"not UTF-8 (byte 0x{raw[exc.start]:02x}); save the file as UTF-8") from None


def _check_bounds(name: str, text: str) -> None:
    """One pass over the YAML events before anything is built: nesting depth, aliases
    (how many, recursion, and how much they expand to), keys per mapping, value length.
    A "billion laughs" file or a 100,000-key mapping stops here, in milliseconds."""
    stack: list[list] = []  # [is_mapping, items, nodes, anchor, line] of each open collection
    sizes: dict[str, int] = {}  # anchor -> nodes it expands to
    aliases = nodes = 0

    def fail(event, message: str) -> None:
        raise SpecError(name, event.start_mark.line + 1 if event.start_mark else 1, None, message)

    def add(event, count: int) -> None:
        nonlocal nodes
        nodes += count
        if nodes > MAX_NODES:
            fail(event, f"too many values (over {MAX_NODES} once aliases are expanded)")
        if stack:
            top = stack[-1]
            top[1] += 1
            top[2] += count
            if top[0] and top[1] > 2 * MAX_KEYS:
                fail(event, f"a mapping with over {MAX_KEYS} keys")

    for event in yaml.parse(text, Loader=_Loader):
        if isinstance(event, (MappingStartEvent, SequenceStartEvent)):
            if len(stack) >= MAX_DEPTH:
                fail(event, f"nested deeper than {MAX_DEPTH} levels")
            stack.append([isinstance(event, MappingStartEvent), 0, 1, event.anchor])
        elif isinstance(event, CollectionEndEvent):
            _, _, count, anchor = stack.pop()
            if anchor is not None:
                sizes[anchor] = count
            add(event, count)
        elif isinstance(event, ScalarEvent):
            if len(event.value) > MAX_SCALAR:
                fail(event, f"a value of {len(event.value)} characters; at most {MAX_SCALAR}")
            if event.anchor is not None:
                sizes[event.anchor] = 1
            add(event, 1)
        elif isinstance(event, AliasEvent):
            aliases += 1
            if aliases > MAX_ALIASES:
                fail(event, f"more than {MAX_ALIASES} aliases")
            if any(open_[3] == event.anchor for open_ in stack):
                fail(event, f"alias *{shorten(event.anchor or '', 40)} refers to a value that contains it")
            add(event, sizes.get(event.anchor or "", 1))  # (an anchor is never "")


def load_yaml(path: str | Path, raw: bytes | None = None) -> Source:
    """Load a YAML file whose top level is a mapping; SpecError on any problem.
    ``raw``: its bytes (up to MAX_FILE_BYTES + 1), read already by the caller."""
    name = str(path)
    if raw is None:
        try:
            with open(path, "rb") as f:
                raw = f.read(MAX_FILE_BYTES + 1)
        except OSError as exc:
            raise SpecError(name, None, None, f"cannot read: {exc.strerror or exc}") from None
    if len(raw) > MAX_FILE_BYTES:
        raise SpecError(name, 1, None, f"larger than {MAX_FILE_BYTES >> 20} MiB; expected a small YAML file")
    text = _decode(name, raw)
    loader = None
    try:
        _check_bounds(name, text)
        loader = _Loader(text)
        node = loader.get_single_node()
        if node is None:
            raise SpecError(name, 1, None, "empty file; expected a YAML mapping")
        if not isinstance(node, MappingNode):
            got = ("a list" if isinstance(node, SequenceNode)
                   else describe(_Builder(name, loader).construct(node, ())))
            raise SpecError(name, node.start_mark.line + 1, None,
                            f"expected a mapping at the top level, got {got}")
        builder = _Builder(name, loader)
        data = builder.build(node, ())
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        problem = ", ".join(shorten(part, 120) for part in (exc.context, exc.problem) if part)
        raise SpecError(name, mark.line + 1 if mark else 1, None, f"not valid YAML: {problem}") from None
    except yaml.reader.ReaderError as exc:
        raise SpecError(name, _line_at(text, exc.position), None,
                        f"not valid YAML: character {exc.character!r} is not allowed") from None
    except yaml.YAMLError as exc:
        raise SpecError(name, 1, None, f"not valid YAML: {shorten(str(exc), 120)}") from None
    finally:
        if loader is not None:
            loader.dispose()
    return Source(name, data, builder.lines)
