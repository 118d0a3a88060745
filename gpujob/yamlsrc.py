"""Line-aware YAML loading and one-line validation errors.

`load_yaml` keeps the 1-based line of every value; `Source.validate` runs a
pydantic model over the data and turns the first problem into a `SpecError`
(`path:line: field: message`) with the best line it knows.
"""

from __future__ import annotations

import difflib
import re
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError, model_validator
from yaml.nodes import MappingNode, ScalarNode, SequenceNode

from gpujob.errors import SpecError

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


def describe(value: Any) -> str:
    """A value as the user wrote it, for 'got ...'."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return repr(value)
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    return str(value)


def suggest(word: str, choices) -> str:
    """' (did you mean 'x'?)' when something in choices is close, else ''."""
    close = difflib.get_close_matches(str(word), [str(c) for c in choices], n=1)
    return f" (did you mean '{close[0]}'?)" if close else ""


def render_loc(loc: Loc) -> str:
    """('profiles', 1, 'packages', 0) -> 'profiles[1].packages[0]'."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


class Strict(BaseModel):
    """Base of every spec/inventory model: strict types, unknown keys are errors."""

    model_config = ConfigDict(strict=True, extra="forbid")

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


def _message(err: dict) -> str:
    """A human message from a pydantic error's type, ctx and input."""
    kind, ctx, got = err["type"], err.get("ctx", {}), describe(err.get("input"))
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
        return f"must be {bounds[kind]} {limit}, got {value}"
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
            problems.append((loc, _message(err)))
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

    def build(self, node, loc: Loc, key_line: int | None = None) -> Any:
        if isinstance(node, MappingNode):
            value = self._mapping(node, loc)
        elif isinstance(node, SequenceNode):
            value = [self.build(item, loc + (i,)) for i, item in enumerate(node.value)]
        else:
            value = self.loader.construct_object(node, deep=True)
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
                        raise SpecError(self.path, key_node.start_mark.line + 1, field, "'<<' needs a mapping")
                    out.update(self._mapping(part, loc))
        own: set = set()
        for key_node, value_node in node.value:
            line = key_node.start_mark.line + 1
            if key_node.tag == _MERGE:
                continue
            if not isinstance(key_node, ScalarNode):
                raise SpecError(self.path, line, field, "keys must be plain scalars")
            # YAML 1.1 reads `on:`/`yes:` keys as booleans; keep them as written.
            key = key_node.value if key_node.tag == _BOOL else self.loader.construct_object(key_node)
            if key in own:
                raise SpecError(self.path, line, field, f"duplicate key {describe(key)}")
            own.add(key)
            out[key] = self.build(value_node, loc + (key,), line)
        return out


def load_yaml(path: str | Path) -> Source:
    """Load a YAML file whose top level is a mapping; SpecError on any problem."""
    name = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise SpecError(name, None, None, f"cannot read: {getattr(exc, 'strerror', None) or exc}") from None
    loader = _Loader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            raise SpecError(name, None, None, "empty file; expected a YAML mapping")
        if not isinstance(node, MappingNode):
            got = "a list" if isinstance(node, SequenceNode) else describe(loader.construct_object(node))
            raise SpecError(name, node.start_mark.line + 1, None, f"expected a mapping at the top level, got {got}")
        builder = _Builder(name, loader)
        data = builder.build(node, ())
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        problem = ", ".join(part for part in (exc.context, exc.problem) if part)
        raise SpecError(name, mark.line + 1 if mark else None, None, f"not valid YAML: {problem}") from None
    finally:
        loader.dispose()
    return Source(name, data, builder.lines)
