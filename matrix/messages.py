"""pydantic's validation errors as a person reads them: the field as written in the file (no union member names such
as `literal[False]` or `CrashExpected` in the path), one problem per mistake (of a union's alternatives, only the one
the input was meant as), and for an unknown name the names that are valid there, with "did you mean"."""

from __future__ import annotations

import difflib
import re
import types
import typing
from collections.abc import Iterable, Mapping
from typing import Any

from pydantic import BaseModel, ValidationError

# A location part pydantic adds for a union's member or a validator, not a field of the file.
_TAG = re.compile(r"(literal|function-\w+|list|dict|tuple|set|is-instance|json-or-python)\[.*\]"
                  r"|str|int|float|bool|none")
_SIMPLE = {"str": "a string", "int": "an integer", "float": "a number", "bool": "true or false", "none": "null"}
# pydantic's error types of a value of the wrong type, and what the file should hold there.
_EXPECTED = {"list_type": "a list", "tuple_type": "a list", "string_type": "a string", "int_type": "an integer",
             "int_from_float": "an integer", "float_type": "a number", "bool_type": "true or false",
             "dict_type": "a mapping (key: value)", "model_type": "a mapping (key: value)",
             "model_attributes_type": "a mapping (key: value)"}


# What a message quotes of a stranger's file: enough to find it, escaped onto one line (no terminal escape, no line
# break forging another line of output), never a whole file's worth (`ln -s /etc/shadow x.yaml` once printed it all).
EXCERPT_CHARS = 60


def excerpt(value: object, limit: int = EXCERPT_CHARS) -> str:
    """`repr(value)`, escaped (printable, one line) and cut to `limit` characters with an ellipsis."""
    text = "".join(c if c.isprintable() else repr(c)[1:-1] for c in repr(value))
    return text if len(text) <= limit else text[:limit - 3] + "..."


def did_you_mean(word: object, choices: Iterable[str]) -> str:
    """` (did you mean 'x'?)` where one of `choices` other than `word` itself is close to it; else nothing (a word
    that is one of the choices is right where they are valid: the message says why it is not here)."""
    others = [str(c) for c in choices if str(c) != str(word)]
    close = difflib.get_close_matches(str(word), others, n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def one_of(choices: Iterable[str], limit: int = 30) -> str:
    """The valid names, listed (the first `limit`, and how many more)."""
    names = sorted(str(c) for c in choices)
    shown = ", ".join(names[:limit])
    return shown + (f", ... ({len(names) - limit} more)" if len(names) > limit else "")


def unknown_name(what: str, word: object, choices: Iterable[str], limit: int = 30) -> str:
    """`unknown <what> 'x' (did you mean 'y'?); valid: a, b, c`."""
    choices = list(choices)
    return f"unknown {what} {excerpt(word)}{did_you_mean(word, choices)}; valid: {one_of(choices, limit)}"


def _is_tag(part: object, models: Mapping[str, type[BaseModel]]) -> bool:
    """A union member's name (a model's class name, or a type's) rather than a field or a key of the file."""
    return isinstance(part, str) and (part in models or _TAG.fullmatch(part) is not None)


def _members(annotation: Any) -> tuple:
    """A union's members (an Optional's too), else the annotation alone."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return typing.get_args(annotation)
    return (annotation,)


def _step(annotation: Any, part: object, models: Mapping[str, type[BaseModel]]) -> Any:
    """The type one location part further in: a model's field, a list's item, a mapping's value, a union member."""
    if _is_tag(part, models):
        return models.get(str(part))
    for member in _members(annotation):
        origin = typing.get_origin(member)
        if isinstance(member, type) and issubclass(member, BaseModel) and isinstance(part, str):
            field = member.model_fields.get(part)
            if field is not None:
                return field.annotation
        elif origin in (list, tuple) and isinstance(part, int):
            return (typing.get_args(member) or (Any,))[0]
        elif origin is dict and isinstance(part, str):
            return (typing.get_args(member) or (Any, Any))[-1]
    return None


def _model_at(root: type[BaseModel], loc: tuple, models: Mapping[str, type[BaseModel]]) -> type[BaseModel] | None:
    """The model whose fields the location (pydantic's, tags included) points into, if it is one."""
    annotation: Any = root
    for part in loc:
        annotation = _step(annotation, part, models)
        if annotation is None:
            return None
    found = [m for m in _members(annotation) if isinstance(m, type) and issubclass(m, BaseModel)]
    return found[0] if len(found) == 1 else None


def _describe(tag: str, models: Mapping[str, type[BaseModel]]) -> str:
    """A union member as the file would write it."""
    if tag in models:
        return f"a mapping of {', '.join(models[tag].model_fields)}"
    if tag.startswith("literal["):
        return tag.removeprefix("literal[")[:-1].replace("False", "false").replace("True", "true")
    if tag.startswith("list["):
        return "a list"
    if tag.startswith("dict["):
        return "a mapping"
    return _SIMPLE.get(tag, tag)


def _field(loc: tuple, models: Mapping[str, type[BaseModel]]) -> str:
    return ".".join(str(part) for part in loc if not _is_tag(part, models))


def _message(error: dict, root: type[BaseModel], models: Mapping[str, type[BaseModel]]) -> str:
    loc = tuple(error["loc"])
    if error["type"] == "extra_forbidden":
        model = _model_at(root, loc[:-1], models)
        fields = list(model.model_fields) if model else []
        return (f"unknown field {excerpt(loc[-1])}{did_you_mean(loc[-1], fields)}"
                + (f"; fields here: {', '.join(fields)}" if fields else ""))
    if error["type"] == "missing":
        return "required, but missing"
    if error["type"] in _EXPECTED:
        return wrong_type(_EXPECTED[error["type"]], error.get("input"))
    if error["type"] == "literal_error" and isinstance(error.get("input"), str):
        expected = re.findall(r"'([^']*)'", error["msg"])
        return f"{excerpt(error['input'])} is not one of {', '.join(expected)}{did_you_mean(error['input'], expected)}"
    return error["msg"].removeprefix("Value error, ")


def as_written(value: object, limit: int = EXCERPT_CHARS) -> str:
    """A value as YAML writes it (true, null, 'fp8', [a, b]), escaped onto one line and cut as `excerpt` cuts."""
    if isinstance(value, bool) or value is None:
        text = {True: "true", False: "false", None: "null"}[value]
    elif isinstance(value, list):
        text = "[" + ", ".join(as_written(v, limit) for v in value[:limit]) + "]"
    elif isinstance(value, dict):
        items = list(value.items())[:limit]
        text = "{" + ", ".join(f"{excerpt(k, limit)}: {as_written(v, limit)}" for k, v in items) + "}"
    else:
        return excerpt(value, limit)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def wrong_type(expected: str, value: object) -> str:
    """`expected a list, not 'fp8' (one value is a list of one: [fp8])`: what the field takes, in the file's words."""
    short = isinstance(value, str | int) and len(str(value)) <= 40 and str(value).isprintable()
    hint = f" (one value is a list of one: [{value}])" if expected == "a list" and short else ""
    return f"expected {expected}, not {as_written(value)}{hint}"


def _union_choice(errors: list[dict], at: int, models: Mapping[str, type[BaseModel]]) -> list[dict]:
    """Of a union's alternatives (the tag at position `at` of each error's location), the errors to show: those of
    the alternative the input was meant as (a mapping given: the member with fields that failed least), or one
    error naming every alternative (a value none of them takes)."""
    branches: dict[str, list[dict]] = {}
    for error in errors:
        branches.setdefault(error["loc"][at], []).append(error)
    inside = [b for b in branches.values() if any(len(e["loc"]) > at + 1 for e in b)]
    if inside:
        return min(inside, key=len)
    first = errors[0]
    alternatives = " or ".join(dict.fromkeys(_describe(tag, models) for tag in branches))
    return [{**first, "loc": first["loc"][:at], "type": "union",
             "msg": f"expected {alternatives}, not {as_written(first.get('input'))}"}]


def readable_problems(err: ValidationError, models: Mapping[str, type[BaseModel]]) -> list[tuple[str, str]]:
    """(the field as the file spells it, a message) for each mistake pydantic found, in its order; `models`:
    the schema's models by class name (how pydantic names a union's model members)."""
    root = models.get(err.title)
    errors: list[dict[str, Any]] = [
        {**e, "loc": tuple(p for p in e["loc"] if not (isinstance(p, str) and p.startswith("function-")))}
        for e in err.errors()]
    unions: dict[tuple, list[dict]] = {}
    for error in errors:
        loc: tuple = error["loc"]
        at = next((i for i, part in enumerate(loc) if _is_tag(part, models)), None)
        unions.setdefault(loc[:at] if at is not None else (*loc, ""), []).append(error)
    shown: list[dict] = []
    for key, group in unions.items():
        shown += group if key[-1:] == ("",) else _union_choice(group, len(key), models)
    problems: list[tuple[str, str]] = []
    for error in shown:
        message = _message(error, root, models) if root else error["msg"]
        problems.append((_field(error["loc"], models), message))
    return list(dict.fromkeys(problems))
