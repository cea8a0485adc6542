"""String `format`s for the JSON-schema compiler, written as patterns in the subset pattern.py
translates. Each accepts only valid instances; some accept fewer than the RFCs allow (noted),
which is sound.
"""

from __future__ import annotations

from langrt.constrained.json_schema.pattern import Translated, translate

_OCTET = "(?:25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])"
_IPV4 = rf"{_OCTET}\.{_OCTET}\.{_OCTET}\.{_OCTET}"
_H16 = "[0-9a-fA-F]{1,4}"
_IPV6 = "|".join(
    [f"(?:{_H16}:){{7}}{_H16}", f"::(?:{_H16}(?::{_H16}){{0,6}})?"]
    + [
        f"(?:{_H16}:){{{k - 1}}}{_H16}::" + (f"(?:{_H16}(?::{_H16}){{0,{6 - k}}})?" if k < 7 else "")
        for k in range(1, 8)
    ]
    + [f"(?:{_H16}:){{6}}{_IPV4}", f"::(?:{_H16}:){{0,5}}{_IPV4}"]
    + [f"(?:{_H16}:){{{k - 1}}}{_H16}::(?:{_H16}:){{0,{5 - k}}}{_IPV4}" for k in range(1, 6)]
)
# RFC 1123 labels (letters, digits, inner hyphens, at most 63 characters) without "--" in the
# 3rd and 4th positions (reserved for A-labels, whose punycode a regex cannot check); at most
# 4 labels, the last one (the top-level label, not all-numeric) starting with a letter and at
# most 61 characters, so the name stays within 253 characters.
_LD, _LDH = "[A-Za-z0-9]", "[A-Za-z0-9-]"


def _label(first: str, max_len: int) -> str:
    return f"{first}(?:{_LDH}{{0,2}}{_LD}|{_LDH}(?:{_LD}{_LDH}|-{_LD}){_LDH}{{0,{max_len - 5}}}{_LD})?"


_HOSTNAME = rf"(?:{_label(_LD, 63)}\.){{0,3}}{_label('[A-Za-z]', 61)}"
_YEAR = "(?:[1-9][0-9]{3}|0[1-9][0-9]{2}|00[1-9][0-9]|000[1-9])"  # Python has no year 0
_LEAP_YEAR = "(?:[0-9]{2}(?:0[48]|[2468][048]|[13579][26])|(?:0[48]|[2468][048]|[13579][26])00)"
_DAY = "(?:0[1-9]|1[0-9]|2[0-8])"
_DATE = (
    f"(?:{_YEAR}-(?:(?:0[13578]|1[02])-(?:{_DAY}|29|3[01])|(?:0[469]|11)-(?:{_DAY}|29|30)|02-{_DAY})"
    f"|{_LEAP_YEAR}-02-29)"
)
# A leap second (:60) is valid only at 23:59:60 UTC: accepted with a zero offset only.
_TIME = (
    r"(?:(?:[01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](?:\.[0-9]+)?(?:[Zz]|[+-](?:[01][0-9]|2[0-3]):[0-5][0-9])"
    r"|23:59:60(?:\.[0-9]+)?(?:[Zz]|[+-]00:00))"
)
_ATOM = "[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]"
_PCT = "%[0-9A-Fa-f]{2}"
_PCHAR = f"(?:[A-Za-z0-9._~!$&'()*+,;=:@-]|{_PCT})"
_URI = (  # RFC 3986 URI (IP-literal hosts: IPv6 only, no IPvFuture)
    rf"[A-Za-z][A-Za-z0-9+.-]*:(?://(?:(?:[A-Za-z0-9._~!$&'()*+,;=:-]|{_PCT})*@)?"
    rf"(?:\[(?:{_IPV6})\]|(?:[A-Za-z0-9._~!$&'()*+,;=-]|{_PCT})*)(?::[0-9]*)?(?:/{_PCHAR}*)*"
    rf"|/(?:{_PCHAR}+(?:/{_PCHAR}*)*)?|{_PCHAR}+(?:/{_PCHAR}*)*)?"
    rf"(?:\?(?:{_PCHAR}|[/?])*)?(?:#(?:{_PCHAR}|[/?])*)?"
)

_QUERY = f"(?:\\?(?:{_PCHAR}|[/?])*)?(?:#(?:{_PCHAR}|[/?])*)?"
_NC_PCHAR = f"(?:[A-Za-z0-9._~!$&'()*+,;=@-]|{_PCT})"  # a pchar but ':'
_RELATIVE_REF = (  # RFC 3986 relative-ref: network-path, absolute path, or a first segment without ':'
    rf"(?://(?:[A-Za-z0-9._~!$&'()*+,;=-]|{_PCT})*(?:/{_PCHAR}*)*"
    rf"|/(?:{_PCHAR}+(?:/{_PCHAR}*)*)?|{_NC_PCHAR}+(?:/{_PCHAR}*)*)?{_QUERY}"
)
_VARSPEC = "[A-Za-z0-9_]+(?:[.][A-Za-z0-9_]+)*(?::[1-9][0-9]{0,3}|[*])?"  # RFC 6570 varname, prefix or explode
_DURATION = (  # ISO 8601 as JSON Schema's appendix: at least one component, weeks alone
    "P(?:(?:[0-9]+D|[0-9]+M(?:[0-9]+D)?|[0-9]+Y(?:[0-9]+M(?:[0-9]+D)?)?)(?:T{t})?|T{t})|P[0-9]+W"
).format(t="(?:[0-9]+H(?:[0-9]+M(?:[0-9]+S)?)?|[0-9]+M(?:[0-9]+S)?|[0-9]+S)")

FORMATS = {
    "date": _DATE,
    "time": _TIME,
    "date-time": f"{_DATE}[Tt]{_TIME}",
    "uuid": "[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}",
    "ipv4": _IPV4,
    "ipv6": f"(?:{_IPV6})",
    "hostname": _HOSTNAME,
    # Dot-atom local part of at most 63 characters (no quoted local parts, no address literals).
    "email": f"{_ATOM}(?:\\.?{_ATOM}){{0,31}}@{_HOSTNAME}",
    "uri": _URI,
    "uri-reference": f"(?:{_URI}|{_RELATIVE_REF})",
    "uri-template": f"(?:[A-Za-z0-9._~!$&'()*+,;=:/?#@%-]|\\{{[+#./;?&]?{_VARSPEC}(?:,{_VARSPEC})*\\}})*",
    "json-pointer": "(?:/(?:[A-Za-z0-9 ._!@$%&()*+,;=:?-]|~[01])*)*",
    "relative-json-pointer": "(?:0|[1-9][0-9]*)(?:#|(?:/(?:[A-Za-z0-9 ._!@$%&()*+,;=:?-]|~[01])*)*)",
    "duration": f"(?:{_DURATION})",
    # ASCII subsets of the internationalized forms (valid instances of them)
    "iri": _URI,
    "iri-reference": f"(?:{_URI}|{_RELATIVE_REF})",
    "idn-hostname": _HOSTNAME,
    "idn-email": f"{_ATOM}(?:\\.?{_ATOM}){{0,31}}@{_HOSTNAME}",
    "regex": "[A-Za-z0-9 _-]*",  # plain text: a regex matching itself
    # OpenAPI's base64 string
    "byte": "(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?",
}
# Every format JSON Schema 2020-12 defines is above (and OpenAPI's "byte"): where a schema asserts
# one its meaning is known, so langrt enforces it. Any other name (OpenAPI's "int32", a
# project's "path") is an annotation no validator can check, and constrains nothing.


def format_pattern(name: str) -> Translated | None:
    """The pattern of a format; None for a name that is no format JSON Schema defines (an
    annotation)."""
    if name not in FORMATS:
        return None
    return translate(f"^(?:{FORMATS[name]})$", "format")
