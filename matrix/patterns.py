"""Cell-id patterns: `*` any text, `?` one character, everything else (`[` and `]` too) literal, matched against a
whole id. What a waiver line and `-k` select cells with. Matched in time linear in the id for each of the pattern's
pieces, never by backtracking: a regular expression of `.*`s takes exponential time on `*a*a*a*a*a*a*a*a*a*Z*` (a
line of a stranger's waivers file stopped `check` for minutes)."""

from __future__ import annotations


def _piece_at(piece: str, text: str, at: int) -> bool:
    """Whether `piece` (literal characters and `?`) matches `text` at position `at`."""
    return at + len(piece) <= len(text) and all(p in ("?", t) for p, t in zip(piece, text[at:at + len(piece)],
                                                                            strict=False))


def _find(piece: str, text: str, start: int, end: int) -> int:
    """The first position from `start` where `piece` matches and ends by `end`; -1 where there is none."""
    if "?" not in piece:
        return text.find(piece, start, end)
    for at in range(start, end - len(piece) + 1):
        if _piece_at(piece, text, at):
            return at
    return -1


def glob_fullmatch(pattern: str, text: str) -> bool:
    """Whether `pattern` (`*` and `?` wildcards, the rest literal) matches the whole of `text`. The pieces between
    stars are found leftmost, one after another (each earliest place leaves the most room for the rest), the last
    one at the end: at most len(pattern) x len(text) steps."""
    pieces = pattern.split("*")
    if len(pieces) == 1:
        return len(pattern) == len(text) and _piece_at(pattern, text, 0)
    first, *middle, last = pieces
    if len(first) + len(last) > len(text) or not _piece_at(first, text, 0):
        return False
    end = len(text) - len(last)
    if not _piece_at(last, text, end):
        return False
    at = len(first)
    for piece in middle:
        found = _find(piece, text, at, end)
        if found < 0:
            return False
        at = found + len(piece)
    return True
