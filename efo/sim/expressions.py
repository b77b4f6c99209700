"""The part of DynamoDB's expression language efo's lease table uses, parsed once per text.

- conditions: comparisons (``=``, ``<>``, ``<``, ``<=``, ``>``, ``>=``) of an attribute with a value,
  ``attribute_exists(a)``, ``attribute_not_exists(a)``, ``begins_with(a, :v)``, joined by ``AND``,
  and such conjunctions joined by ``OR`` (no parentheses: ``AND`` binds first, as in DynamoDB);
- updates: ``SET a = :v``, ``SET a = a + :v`` (or ``-``), ``REMOVE a, b``, ``ADD a :v`` (a number,
  or a string set), ``DELETE a :v`` (a string set);
- key conditions: ``pk = :v`` and optionally ``AND`` one condition on the sort key
  (a comparison, ``begins_with`` or ``BETWEEN``);
- projections: attribute names, comma-separated.

Anything else (``NOT``, parentheses, ``#names``, nested paths) raises
:class:`UnsupportedExpression`, which the simulated DynamoDB answers with a ValidationException:
a change to the table's code that needs more of the language fails loudly in the simulation.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

Item = Mapping[str, Any]
Values = Mapping[str, Any]

_NAME = r"[A-Za-z_][A-Za-z0-9_]*"
_VALUE = r":[A-Za-z0-9_]+"
_COMPARISON = re.compile(rf"^({_NAME})\s*(=|<>|<=|>=|<|>)\s*({_VALUE})$")
_FUNCTION = re.compile(rf"^(attribute_exists|attribute_not_exists)\(\s*({_NAME})\s*\)$")
_BEGINS = re.compile(rf"^begins_with\(\s*({_NAME})\s*,\s*({_VALUE})\s*\)$")
_BETWEEN = re.compile(rf"^({_NAME})\s+BETWEEN\s+({_VALUE})\s+AND\s+({_VALUE})$")
_SET_VALUE = re.compile(rf"^({_NAME})\s*=\s*({_VALUE})$")
_SET_ARITHMETIC = re.compile(rf"^({_NAME})\s*=\s*({_NAME})\s*([+-])\s*({_VALUE})$")
_ADD = re.compile(rf"^({_NAME})\s+({_VALUE})$")
_CLAUSE = re.compile(r"\b(SET|REMOVE|ADD|DELETE)\b")


class UnsupportedExpression(ValueError):
    pass


def _scalar(value: Mapping[str, Any]) -> Any:
    """A comparable Python value of an attribute value (S, N, B, BOOL)."""
    kind, inner = next(iter(value.items()))
    if kind == "N":
        return Decimal(inner)
    if kind in ("S", "B", "BOOL"):
        return inner
    raise UnsupportedExpression(f"comparison of a {kind} value")


_OPERATORS: dict[str, Callable[[Any, Any], bool]] = {
    "=": lambda a, b: a == b,
    "<>": lambda a, b: a != b,
    "<": lambda a, b: a < b,
    "<=": lambda a, b: a <= b,
    ">": lambda a, b: a > b,
    ">=": lambda a, b: a >= b,
}


def _compare(item: Item | None, name: str, operator: str, value: Mapping[str, Any]) -> bool:
    current = (item or {}).get(name)
    if current is None:
        return operator == "<>"  # a missing attribute differs from every value, and is not ordered
    if next(iter(current)) != next(iter(value)):
        return operator == "<>"
    return _OPERATORS[operator](_scalar(current), _scalar(value))


Predicate = Callable[[Item | None, Values], bool]


def _atom(text: str) -> Predicate:
    text = text.strip()
    if match := _COMPARISON.match(text):
        name, operator, placeholder = match.groups()
        return lambda item, values: _compare(item, name, operator, values[placeholder])
    if match := _FUNCTION.match(text):
        function, name = match.groups()
        exists = function == "attribute_exists"
        return lambda item, values: (name in (item or {})) == exists
    if match := _BEGINS.match(text):
        name, placeholder = match.groups()

        def begins(item: Item | None, values: Values) -> bool:
            current = (item or {}).get(name, {}).get("S")
            return current is not None and current.startswith(values[placeholder]["S"])

        return begins
    if match := _BETWEEN.match(text):
        name, low, high = match.groups()
        return lambda item, values: _compare(item, name, ">=", values[low]) and _compare(item, name, "<=", values[high])
    raise UnsupportedExpression(f"condition {text!r}")


def _split_and(text: str) -> list[str]:
    """``a AND b AND c`` (a BETWEEN's own AND kept with it)."""
    if "(" in text.replace("attribute_exists(", "").replace("attribute_not_exists(", "").replace("begins_with(", ""):
        raise UnsupportedExpression(f"parentheses in {text!r}")
    if re.search(r"\b(OR|NOT)\b", text):
        raise UnsupportedExpression(f"OR or NOT in {text!r}")  # OR is split off first, by condition()
    parts = re.split(r"\s+AND\s+", text.strip())
    atoms: list[str] = []
    for part in parts:
        if atoms and re.search(r"\bBETWEEN\s+\S+$", atoms[-1]):
            atoms[-1] += " AND " + part
        else:
            atoms.append(part)
    return atoms


@functools.cache
def condition(text: str) -> Predicate:
    """The predicate of a ConditionExpression: conjunctions joined by OR."""
    groups = [[_atom(part) for part in _split_and(group)] for group in re.split(r"\s+OR\s+", text.strip())]
    return lambda item, values: any(all(atom(item, values) for atom in atoms) for atoms in groups)


#: A run of sort keys: its lower and upper bound, each (placeholder, inclusive) or None (open).
Bounds = tuple[tuple[str, bool] | None, tuple[str, bool] | None]


@dataclass(frozen=True)
class KeyCondition:
    partition_placeholder: str
    sort: Predicate | None  # on the sort key, or None
    #: The placeholder of the sort key's prefix when the condition on it is begins_with (the keys
    #: that match are then one run of the sorted keys), else None.
    prefix_placeholder: str | None = None
    #: The condition on the sort key as bounds, when it is a comparison other than ``<>`` or a BETWEEN
    #: (the keys that match are then one run of the sorted keys too): each bound is (placeholder,
    #: inclusive), or None where the run is open. None: no such condition.
    range_bounds: Bounds | None = None


_BOUNDS: dict[str, Callable[[str], Bounds]] = {
    "=": lambda v: ((v, True), (v, True)),
    "<": lambda v: (None, (v, False)),
    "<=": lambda v: (None, (v, True)),
    ">": lambda v: ((v, False), None),
    ">=": lambda v: ((v, True), None),
}


@functools.cache
def key_condition(text: str, hash_key: str, range_key: str) -> KeyCondition:
    atoms = _split_and(text)
    partition = _COMPARISON.match(atoms[0].strip())
    if partition is None or partition.group(1) != hash_key or partition.group(2) != "=" or len(atoms) > 2:
        raise UnsupportedExpression(f"key condition {text!r}")
    sort = None
    prefix = None
    bounds = None
    if len(atoms) == 2:
        if range_key not in atoms[1]:
            raise UnsupportedExpression(f"key condition {text!r}")
        sort = _atom(atoms[1])
        begins = _BEGINS.match(atoms[1].strip())
        if begins is not None and begins.group(1) == range_key:
            prefix = begins.group(2)
        comparison = _COMPARISON.match(atoms[1].strip())
        if comparison is not None and comparison.group(1) == range_key and comparison.group(2) in _BOUNDS:
            bounds = _BOUNDS[comparison.group(2)](comparison.group(3))
        between = _BETWEEN.match(atoms[1].strip())
        if between is not None and between.group(1) == range_key:
            bounds = ((between.group(2), True), (between.group(3), True))
    return KeyCondition(partition.group(3), sort, prefix, bounds)


Update = Callable[[dict[str, Any], Values], None]


def _number(value: Mapping[str, Any]) -> Decimal:
    if "N" not in value:
        raise UnsupportedExpression("arithmetic on a value that is not a number")
    return Decimal(value["N"])


def _render(number: Decimal) -> str:
    return str(number.normalize()) if number != number.to_integral() else str(int(number))


def _set(part: str) -> Update:
    if match := _SET_VALUE.match(part):
        name, placeholder = match.groups()

        def assign(item: dict[str, Any], values: Values) -> None:
            item[name] = values[placeholder]

        return assign
    if match := _SET_ARITHMETIC.match(part):
        name, operand, sign, placeholder = match.groups()

        def arithmetic(item: dict[str, Any], values: Values) -> None:
            if operand not in item:
                raise UnsupportedExpression(f"the attribute {operand!r} the update refers to does not exist")
            delta = _number(values[placeholder])
            result = _number(item[operand]) + (delta if sign == "+" else -delta)
            item[name] = {"N": _render(result)}

        return arithmetic
    raise UnsupportedExpression(f"SET {part!r}")


def _add(part: str) -> Update:
    match = _ADD.match(part)
    if match is None:
        raise UnsupportedExpression(f"ADD {part!r}")
    name, placeholder = match.groups()

    def add(item: dict[str, Any], values: Values) -> None:
        value = values[placeholder]
        if "SS" in value:  # a string set: the union
            item[name] = {"SS": sorted(_string_set(item, name) | _strings(value))}
            return
        if name in item and "N" not in item[name]:
            raise UnsupportedExpression(f"ADD of a number to {name!r}, which is not one")
        current = _number(item[name]) if name in item else Decimal(0)
        item[name] = {"N": _render(current + _number(value))}

    return add


def _delete(part: str) -> Update:
    match = _ADD.match(part)
    if match is None:
        raise UnsupportedExpression(f"DELETE {part!r}")
    name, placeholder = match.groups()

    def delete(item: dict[str, Any], values: Values) -> None:
        value = values[placeholder]
        if "SS" not in value:
            raise UnsupportedExpression(f"DELETE of {value!r}: a string set only")
        kept = sorted(_string_set(item, name) - _strings(value))
        if kept:
            item[name] = {"SS": kept}
        else:  # DynamoDB keeps no empty set
            item.pop(name, None)

    return delete


def _strings(value: dict[str, Any]) -> set[str]:
    """A string set value, as DynamoDB takes one: not empty, no duplicates."""
    strings = value["SS"]
    if not strings or len(set(strings)) != len(strings):
        raise UnsupportedExpression(f"a string set must hold distinct strings, at least one: {strings!r}")
    return set(strings)


def _string_set(item: dict[str, Any], name: str) -> set[str]:
    """The item's string set ``name`` (none: empty); an attribute of another type is refused."""
    if name not in item:
        return set()
    if "SS" not in item[name]:
        raise UnsupportedExpression(f"{name!r} is not a string set")
    return set(item[name]["SS"])


def _remove(part: str) -> Update:
    name = part.strip()
    if not re.fullmatch(_NAME, name):
        raise UnsupportedExpression(f"REMOVE {part!r}")
    return lambda item, values: item.pop(name, None)  # type: ignore[return-value]


def _clauses(text: str) -> list[tuple[str, list[str]]]:
    """An UpdateExpression's clauses: each keyword, with its comma-separated parts."""
    pieces = _CLAUSE.split(text)
    if pieces[0].strip():
        raise UnsupportedExpression(f"update {text!r}")
    return [
        (keyword, [p.strip() for p in body.split(",") if p.strip()])
        for keyword, body in zip(pieces[1::2], pieces[2::2], strict=True)
    ]


@functools.cache
def update(text: str) -> Update:
    """The change an UpdateExpression makes to an item (in place)."""
    steps: list[Update] = []
    for keyword, parts in _clauses(text):
        if keyword == "SET":
            steps += [_set(p) for p in parts]
        elif keyword == "REMOVE":
            steps += [_remove(p) for p in parts]
        elif keyword == "ADD":
            steps += [_add(p) for p in parts]
        elif keyword == "DELETE":
            steps += [_delete(p) for p in parts]
        else:
            raise UnsupportedExpression(f"{keyword} in {text!r}")

    def apply(item: dict[str, Any], values: Values) -> None:
        for step in steps:
            step(item, values)

    return apply


@functools.cache
def updated(text: str) -> frozenset[str]:
    """The attributes an UpdateExpression sets, adds to or deletes from (not those it removes): those
    of them the item still has after it are what UpdateItem's ``ReturnValues="UPDATED_NEW"`` answers
    (a DELETE that empties a set leaves no attribute to answer). :func:`update` checks the text."""
    return frozenset(
        re.split(r"[\s=]", part, maxsplit=1)[0]
        for keyword, parts in _clauses(text)
        if keyword != "REMOVE"
        for part in parts
    )


@functools.cache
def projection(text: str) -> tuple[str, ...]:
    names = tuple(name.strip() for name in text.split(","))
    for name in names:
        if not re.fullmatch(_NAME, name):
            raise UnsupportedExpression(f"projection {text!r}")
    return names
