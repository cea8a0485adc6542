"""Numbers for the JSON-schema compiler: bounds compared as exact decimals, multipleOf by listing
multiples (or by the last digits), so that what a literal parses to is never out of bounds.
"""

from __future__ import annotations

import math
from decimal import Decimal
from functools import reduce

from langrt.constrained.json_schema import regex as rx
from langrt.constrained.json_schema.flat import Flat
from langrt.constrained.json_schema.number_range import number_range
from langrt.errors import UnsupportedSchema

# Why 256: multipleOf (other than 1 or a divisor of 100) is enforced by listing the multiples.
MAX_LISTED_MULTIPLES = 256


def number_regex(f: Flat) -> str | None:
    """Number literals within the bounds and multipleOf of `f`."""
    integer_only = "number" not in f.types
    lo, hi = _tightest(f.lower, lower=True), _tightest(f.upper, lower=False)
    step = _multiple(f.multiple_of)
    if step is not None:
        integer_only = True  # only integer literals are generated for multiples (sound)
    int_lo = None if lo is None else (math.floor(lo[0]) + 1 if lo[1] else math.ceil(lo[0]))
    int_hi = None if hi is None else (math.ceil(hi[0]) - 1 if hi[1] else math.floor(hi[0]))
    if step is not None and step != 1:
        return _multiples(step, int_lo, int_hi)
    if lo is None and hi is None:
        return rx.INTEGER if integer_only else rx.NUMBER
    parts = [number_range(_dec(int_lo), _dec(int_hi), fraction=False)]
    if not integer_only:
        dec_lo, dec_hi = _float_bound(lo, +1), _float_bound(hi, -1)
        if not (dec_lo is not None and dec_lo.is_infinite() or dec_hi is not None and dec_hi.is_infinite()):
            parts.append(number_range(dec_lo, dec_hi, fraction=True))
    return rx.alt(parts)


def _tightest(bounds, lower: bool):
    """The tightest (Decimal value, exclusive) of (value, exclusive) bounds, or None."""
    best = None
    for v, ex in bounds:
        d = Decimal(v)
        if best is None or (d > best[0] if lower else d < best[0]):
            best = (d, ex)
        elif d == best[0]:
            best = (d, best[1] or ex)
    return best


def _dec(v: int | None) -> Decimal | None:
    return None if v is None else Decimal(v)


def _float_bound(bound, direction: int) -> Decimal | None:
    """A decimal bound for literals with a fraction part, which parse as floats: a literal x
    with x >= b (decimal) parses to float(x) >= float(b), rounding being monotonic; an
    exclusive bound moves past the bound. b is the bound's shortest repr, which parses back
    to exactly the schema's float."""
    if bound is None:
        return None
    value, exclusive = bound
    f = float(value)
    if Decimal(f) != value:
        keyword = (
            ("exclusiveMinimum" if exclusive else "minimum")
            if direction > 0
            else ("exclusiveMaximum" if exclusive else "maximum")
        )
        raise UnsupportedSchema(f"a number bound of {value} is not exactly representable as a float", param=keyword)
    if exclusive:
        # A few digits past the bound (the literals between are left out, which is sound): the
        # next float itself can have hundreds of digits (after 0: 5e-324), a regex nested as deep.
        for k in (6, 9, 12):
            d = value + direction * Decimal(10) ** -k
            if (float(d) - f) * direction > 0:
                return d
        f = math.nextafter(f, math.inf * direction)
    if math.isinf(f):
        return Decimal(f)
    return Decimal(repr(f))


def _multiple(values) -> int | None:
    """The combined multipleOf as an integer (lcm), None if absent."""
    if not values:
        return None
    ints = []
    for v in values:
        if isinstance(v, float) and not v.is_integer():
            raise UnsupportedSchema(
                f"'multipleOf': {v} is not an integer (floating-point multiples cannot be checked exactly)",
                param="multipleOf",
            )
        ints.append(int(v))
    return reduce(math.lcm, ints)


def _multiples(step: int, lo: int | None, hi: int | None) -> str | None:
    """Integer literals that are multiples of `step` within [lo, hi]."""
    if lo is not None and hi is not None:
        first, last = -((-lo) // step) * step, (hi // step) * step
        if first > last:
            return None
        if (last - first) // step < MAX_LISTED_MULTIPLES:
            return rx.alt(str(v) for v in range(first, last + 1, step))
    if 100 % step == 0 and lo in (None, 0) and hi in (None, 0):
        # Divisors of 100: the last two digits decide. Multiples below 100 are listed.
        small = "|".join(str(v) for v in range(step, 100, step))
        ends = "|".join("%02d" % v for v in range(0, 100, step))
        magnitude = f"(?:{small}|[1-9][0-9]*(?:{ends}))"
        parts = ["0"]
        if hi is None:
            parts.append(magnitude)
        if lo is None:
            parts.append("-" + magnitude)
        return rx.alt(parts)
    raise UnsupportedSchema(
        f"'multipleOf': {step} is supported only for ranges with at most {MAX_LISTED_MULTIPLES} multiples, "
        "or divisors of 100 without other bounds than 0",
        param="multipleOf",
    )
