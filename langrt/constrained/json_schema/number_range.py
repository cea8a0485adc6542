"""JSON number literals between two exact decimal bounds, as a regex (numeric.py's bounds): digit
by digit, the bounds' digits kept tight only while the literal is equal to them so far."""

from __future__ import annotations

from decimal import Decimal

from langrt.constrained.json_schema.regex import alt, group, repeat, seq


def number_range(lo: Decimal | None, hi: Decimal | None, fraction: bool) -> str | None:
    """JSON number literals (no exponent) with lo <= value <= hi (None: unbounded), compared as
    exact decimals. fraction=False: integers only (`-?(0|[1-9][0-9]*)`); True: only literals
    with a fraction part (`1.0`, `-0.25`)."""
    if lo is not None and hi is not None and lo > hi:
        return None
    parts = []
    if hi is None or hi >= 0:
        parts.append(_magnitude(max(lo, Decimal(0)) if lo is not None else Decimal(0), hi, fraction))
    if lo is None or lo < 0:
        mag_lo = -hi if hi is not None and hi < 0 else Decimal(0)
        parts.append(seq("-", _wrap(_magnitude(mag_lo, -lo if lo is not None else None, fraction))))
    return alt(parts)


def _wrap(r: str | None) -> str | None:
    return None if r is None else group(r)


def _digits(d: Decimal) -> tuple[str, str]:
    text = format(d, "f")
    whole, _, frac = text.partition(".")
    return whole, frac.rstrip("0")


def _magnitude(lo: Decimal, hi: Decimal | None, fraction: bool) -> str | None:
    """Non-negative literals in [lo, hi]."""
    if hi is not None and lo > hi:
        return None
    lo_int, lo_frac = _digits(lo)
    parts = []
    if hi is None:
        top = len(lo_int)
        # Every integer part longer than lo's is above it.
        parts.append("[1-9][0-9]{%d,}" % len(lo_int) + ("\\.[0-9]+" if fraction else ""))
    else:
        hi_int, hi_frac = _digits(hi)
        top = len(hi_int)
    for n in range(len(lo_int), top + 1):
        lo_s = lo_int + lo_frac if n == len(lo_int) else None
        hi_s = (hi_int + hi_frac) if hi is not None and n == top else None
        parts.append(_Digits(n, fraction).gen(0, lo_s, hi_s))
    return alt(parts)


def _digit_class(a: int, b: int) -> str:
    return str(a) if a == b else f"[{a}{b}]" if b == a + 1 else f"[{a}-{b}]"


class _Digits:
    """Digit strings with an n-digit integer part (no leading zero unless n == 1), then an
    optional / required / forbidden fraction, between the digit strings `lo` and `hi` (same
    decimal point position; missing digits are zeros). `None` bounds are open."""

    def __init__(self, n: int, fraction: bool):
        self.n, self.fraction = n, fraction

    def gen(self, pos: int, lo: str | None, hi: str | None) -> str | None:
        if lo is not None and not lo[pos:].strip("0"):
            lo = None  # every continuation is >= lo
        if lo is None and hi is None:
            return self.free(pos)
        n = self.n
        if pos >= n:
            if hi is not None and not hi[pos:].strip("0"):
                # Equal to hi so far and hi has nothing more: only zeros may follow.
                if not self.fraction:
                    return ""
                return "\\.0+" if pos == n else "0*"
            if not self.fraction:
                return "" if lo is None else None
            step = self.step(pos, lo, hi)
            if pos == n:
                return seq("\\.", step)
            return alt(([""] if lo is None else []) + [step])
        return self.step(pos, lo, hi)

    def step(self, pos: int, lo: str | None, hi: str | None) -> str | None:
        dig = lambda s: int(s[pos]) if pos < len(s) else 0  # noqa: E731
        d_lo = dig(lo) if lo is not None else (1 if pos == 0 and self.n > 1 else 0)
        d_hi = dig(hi) if hi is not None else 9
        runs: list[list] = []  # [first digit, last digit, continuation]: digits sharing one
        for d in range(d_lo, d_hi + 1):
            tight_lo = lo if lo is not None and d == d_lo else None
            tight_hi = hi if hi is not None and d == d_hi else None
            cont = self.gen(pos + 1, tight_lo, tight_hi) if tight_lo or tight_hi else self.free(pos + 1)
            if runs and runs[-1][2] == cont:
                runs[-1][1] = d
            else:
                runs.append([d, d, cont])
        return alt(seq(_digit_class(a, b), cont) for a, b, cont in runs)

    def free(self, pos: int) -> str:
        n = self.n
        if pos < n:
            head = "[1-9]" if pos == 0 and n > 1 else "[0-9]"
            rest = n - pos - 1 if pos == 0 and n > 1 else n - pos
            if pos == 0 and n > 1:
                body = head + repeat("[0-9]", rest, rest)
            else:
                body = repeat("[0-9]", rest, rest)
            return body + ("\\.[0-9]+" if self.fraction else "")
        if pos == n:
            return "\\.[0-9]+" if self.fraction else ""
        return "[0-9]*"
