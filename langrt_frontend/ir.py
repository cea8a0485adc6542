"""The program IR: what `s += ...` queues. Nodes are frozen dataclasses; `+` builds an
`ExprList` (flattened), and plain strings join in as `Text`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterator

from langrt_frontend.params import GenParams


class Expr:
    """Base of every node: `a + b` with nodes or strings on either side."""

    def __add__(self, other) -> "ExprList":
        other = as_expr(other, strict=False)
        return NotImplemented if other is None else ExprList((*_items(self), *_items(other)))

    def __radd__(self, other) -> "ExprList":
        other = as_expr(other, strict=False)
        return NotImplemented if other is None else ExprList((*_items(other), *_items(self)))

    def variable_names(self) -> Iterator[str]:
        """Names of the variables this node sets when it runs."""
        return iter(())


@dataclass(frozen=True)
class Text(Expr):
    value: str


@dataclass(frozen=True)
class Gen(Expr):
    name: str | None
    params: GenParams

    def variable_names(self):
        return iter(() if self.name is None else (self.name,))


@dataclass(frozen=True)
class Select(Expr):
    name: str | None
    choices: tuple[str, ...]
    temperature: float
    method: Any  # a choice method (choices.py): callable, with requires_unconditional

    def variable_names(self):
        return iter(() if self.name is None else (self.name,))


@dataclass(frozen=True)
class RoleBegin(Expr):
    role: str


@dataclass(frozen=True)
class RoleEnd(Expr):
    role: str


@dataclass(frozen=True)
class VarScopeBegin(Expr):
    name: str


@dataclass(frozen=True)
class VarScopeEnd(Expr):
    name: str

    def variable_names(self):
        return iter((self.name,))


@dataclass(frozen=True)
class Image(Expr):
    path: str


@dataclass(frozen=True)
class Video(Expr):
    path: str
    num_frames: int


@dataclass(frozen=True)
class ConcatAndAppend(Expr):
    """Append the new text of forked children (join mode "concate_and_append")."""

    children: tuple  # executors of the forked states, in fork order


@dataclass(frozen=True)
class ExprList(Expr):
    items: tuple[Expr, ...]

    def variable_names(self):
        for item in self.items:
            yield from item.variable_names()


def as_expr(value, strict: bool = True) -> Expr | None:
    """A node for `value` (str -> Text). Unsupported values: TypeError when strict, else None."""
    if isinstance(value, Expr):
        return value
    if isinstance(value, str):
        return Text(value)
    if value is None and strict:
        raise ValueError("cannot append None to a program state")
    if strict:
        raise TypeError(f"cannot append a {type(value).__name__} to a program state; use a str or an expression")
    return None


def _items(expr: Expr) -> tuple[Expr, ...]:
    return expr.items if isinstance(expr, ExprList) else (expr,)
