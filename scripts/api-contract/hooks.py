"""schemathesis hooks for scripts/api-contract.sh.

A push that a generated case sends with `Content-Encoding: gzip` (or `x-gzip`) goes out
gzip-compressed, as the document describes that variant: schemathesis itself only writes plain
JSON, and a plain body under that header is rightly refused (400), so without this hook the gzip
variant could not be tested at all.
"""

import gzip
import json

import schemathesis
from schemathesis.core import NOT_SET


@schemathesis.hook
def before_call(context, case, kwargs):
    headers = case.headers or {}
    encoding = next(
        (v for k, v in headers.items() if isinstance(k, str) and k.lower() == "content-encoding"),
        None,
    )
    if not isinstance(encoding, str) or encoding.strip().lower() not in ("gzip", "x-gzip"):
        return
    if case.body is NOT_SET:
        return
    try:
        plain = json.dumps(case.body).encode()
    except (TypeError, ValueError):
        return
    # Transport keyword arguments win over the serialized case: the body goes as these bytes.
    kwargs["data"] = gzip.compress(plain)
    kwargs["json"] = None
