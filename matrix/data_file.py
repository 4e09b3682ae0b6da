"""A case folder's data file read as data: a regular file of the folder (no link out of it, device or pipe) of
bounded size, UTF-8 YAML read with a SafeLoader without aliases or a key given twice; every refusal a CaseError
naming the file, with the path escaped onto one line."""

from __future__ import annotations

import copy
import functools
import stat
from collections.abc import Hashable
from pathlib import Path
from typing import Any

import yaml

from kvmatrix.matrix.schema import CaseError

# Bounds on a data file: the shipped ones are at most a few KiB, and nothing in one is worth more.
MAX_FILE_BYTES = 1 << 20


class _DataLoader(yaml.SafeLoader):
    """`yaml.safe_load` without what no data file needs and a hostile one abuses: aliases (`*name`: 600 bytes of
    nested aliases expand to a 112 MB engine argument) and a key given twice (YAML keeps the last one silently:
    a second `expect:` would drop the first's rules)."""

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            raise yaml.MarkedYAMLError(None, None, "an alias (*name): data files repeat nothing by reference; "
                                       "write the value out, or share a block with include:",
                                       self.peek_event().start_mark)
        return super().compose_node(parent, index)

    def construct_mapping(self, node: Any, deep: bool = False) -> Any:
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            if isinstance(key, Hashable) and key in seen:
                raise yaml.MarkedYAMLError(None, None, f"key {key!r} appears twice in one mapping",
                                           key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep)


def shown(path: Path | str) -> str:
    """A path as messages show it: a character that is not printable (a line break, bytes that are not UTF-8)
    escaped, so that the message stays one line and can be printed."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in str(path))


def leaves_its_folder(path: Path) -> bool:
    """Whether `path` is a link (or goes through one) to a file outside the folder it is named in: reading it
    would read, and a message might quote, a file the folder's author chose anywhere (`ln -s /etc/shadow x.yaml`)."""
    return Path(path).resolve().parent != Path(path).parent.resolve()


def read_data_file(path: Path) -> bytes:
    """A case folder's file, read only where it is a regular file of that folder (not a link out of it, a device or
    a pipe) of at most MAX_FILE_BYTES; else CaseError naming the file."""
    where = shown(path)
    try:
        if not stat.S_ISREG(Path(path).stat().st_mode):  # a device or a pipe would be read forever
            raise CaseError(where, None, None, "not a regular file")
        if leaves_its_folder(Path(path)):
            raise CaseError(where, None, None, "a link to a file outside its folder: a case folder's files are "
                                               "read from that folder only")
        with open(path, "rb") as f:
            data = f.read(MAX_FILE_BYTES + 1)
    except OSError as err:
        raise CaseError(where, None, None, f"cannot read: {err.strerror}") from None
    if len(data) > MAX_FILE_BYTES:
        raise CaseError(where, None, None, f"over {MAX_FILE_BYTES >> 10} KiB: no data file needs that much")
    return data


def read_yaml(path: Path) -> Any:
    """A data file's YAML (nothing in it executed), or CaseError naming the file: unreadable, not a regular file,
    over MAX_FILE_BYTES, not UTF-8, not YAML, nested past the parser's depth, or with aliases or a key twice."""
    where = shown(path)
    data = read_data_file(path)
    try:
        text = data.decode("utf-8").removeprefix("\ufeff")
    except UnicodeDecodeError as err:
        line = data[:err.start].count(b"\n") + 1
        raise CaseError(where, None, None, f"not UTF-8 text: byte 0x{data[err.start]:02x} on line {line}") from None
    try:
        return copy.deepcopy(_parsed(text))  # the caller's own copy: it may change what it was given
    except yaml.YAMLError as err:
        raise CaseError(where, None, None, f"not valid YAML: {_one_line(err)}") from None
    except RecursionError:
        raise CaseError(where, None, None, "not valid YAML: nested too deeply to read") from None


@functools.lru_cache(maxsize=32)
def _parsed(text: str) -> Any:
    """The YAML of a file's text, parsed once per process: every case a process loads reads the model registry and
    the pool again (`load.py` `_load_named`), and PyYAML's pure-Python parser costs more than the rest of a load.
    A text that does not parse raises each time (lru_cache keeps no exception)."""
    return yaml.load(text, Loader=_DataLoader)  # noqa: S506 - _DataLoader is a SafeLoader


def _one_line(err: yaml.YAMLError) -> str:
    """PyYAML's error as one line: what is wrong and where (its own message spans several, with a snippet)."""
    if not isinstance(err, yaml.MarkedYAMLError):
        return " ".join(str(err).split())
    where = f" (line {err.problem_mark.line + 1}, column {err.problem_mark.column + 1})" if err.problem_mark else ""
    return " ".join(filter(None, [err.context, err.problem])) + where
