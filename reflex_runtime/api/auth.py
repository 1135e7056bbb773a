"""The API key, checked the same way on every transport.

One grammar, the HTTP `Authorization` header's: `<scheme> <key>` where the scheme is `bearer` in
any case, separated from the key by any run of spaces or tabs; surrounding spaces and tabs are
trimmed. HTTP front ends read the header; JSON lines and Lambda direct invokes carry the same
string in an `"authorization"` field. Only a configured key is ever required (no key: all open),
and health (`GET /healthz`, the `ping` op) never needs one. Keys are compared in constant time.

One credential per request: HTTP front ends join repeated headers with ", " (as RFC 9110 allows and
as Lambda delivers them), and a value with a comma is refused whatever it holds, so a request
with a wrong and a right Authorization header fails in either order (a key cannot contain ",").
"""

from __future__ import annotations

from ..errors import RequestError

_BLANKS = " \t"
MESSAGE = "missing or invalid API key (send 'Authorization: Bearer <key>')"
SEVERAL = "more than one Authorization credential (send one 'Authorization: Bearer <key>' header)"


def bearer_key(value) -> str | None:
    """The key in an Authorization value, or None when it is not `Bearer <key>`."""
    if not isinstance(value, str):
        return None
    value = value.strip(_BLANKS)
    i = 0
    while i < len(value) and value[i] not in _BLANKS:
        i += 1
    scheme, key = value[:i], value[i:].strip(_BLANKS)
    if scheme.lower() != "bearer" or not key:
        return None
    return key


def check(value, api_key: str | None) -> None:
    """Raise the 401 RequestError unless `value` carries `api_key` (or no key is configured)."""
    if not api_key:
        return
    import hmac  # only with a key: the CLI's cold path never needs it

    if isinstance(value, str) and "," in value:
        raise RequestError(SEVERAL, status=401, code="invalid_api_key")
    got = bearer_key(value)
    # compare_digest on bytes: any code point encodes (surrogatepass), and the time does not
    # depend on where the strings differ.
    if got is None or not hmac.compare_digest(got.encode("utf-8", "surrogatepass"),
                                              api_key.encode("utf-8", "surrogatepass")):
        raise RequestError(MESSAGE, status=401, code="invalid_api_key")
