"""The fields of a `multipart/form-data` body (the speech-to-text APIs send their audio so): routing
reads only the small text fields (`model`, `stream`), and the body goes to the pod as the client
sent it, so a file part is never decoded or copied: its field holds the file's name."""

from __future__ import annotations

import re

from serve_app.gateway.errors import bad_request

FORM_TYPE = "multipart/form-data"
_BOUNDARY = re.compile(r'boundary="?([^";,\s]+)"?', re.IGNORECASE)
_NAME = re.compile(rb';\s*name="([^"]*)"', re.IGNORECASE)
_FILENAME = re.compile(rb';\s*filename\*?="?([^";\r\n]*)"?', re.IGNORECASE)


def form_fields(raw: bytes, content_type: str) -> dict[str, str]:
    """name → text of each text part, name → file name of each file part; a body that is not a
    well-formed form is a 400 that says why."""
    if not content_type.lower().startswith(FORM_TYPE):
        raise bad_request(f"this route takes a {FORM_TYPE} body, got content-type {content_type[:80]!r}")
    found = _BOUNDARY.search(content_type)
    if found is None:
        raise bad_request(f"the {FORM_TYPE} content-type names no boundary")
    delimiter = b"--" + found.group(1).encode("latin-1")
    at = raw.find(delimiter)
    if at < 0:
        raise bad_request("the form body does not hold its boundary")
    fields: dict[str, str] = {}
    while not raw.startswith(b"--", at + len(delimiter)):  # `--boundary--` closes the form
        head_end = raw.find(b"\r\n\r\n", at)
        end = raw.find(b"\r\n" + delimiter, head_end)
        if head_end < 0 or end < 0:
            raise bad_request("the form body ends inside a part")
        head = raw[at + len(delimiter) : head_end]
        name = _NAME.search(head)
        if name is not None:
            filename = _FILENAME.search(head)
            value = filename.group(1) if filename is not None else raw[head_end + 4 : end]
            fields[name.group(1).decode(errors="replace")] = value.decode(errors="replace")
        at = end + 2
    return fields
