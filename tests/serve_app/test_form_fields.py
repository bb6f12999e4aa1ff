"""The gateway's reading of a multipart form (serve_app/gateway/form_fields.py) on bodies as real clients
encode them (httpx's encoder, which the openai SDK uses): text fields decoded, a file part named
by its file name and never decoded, and a malformed form a 400 that says why."""

from __future__ import annotations

import httpx
import pytest

from serve_app.gateway.errors import GatewayError
from serve_app.gateway.form_fields import form_fields

AUDIO = bytes(range(256)) * 64  # every byte value, CR and LF and '-' included


def encoded(data: dict, files: dict) -> tuple[bytes, str]:
    request = httpx.Request("POST", "http://127.0.0.1/", data=data, files=files)
    return request.read(), request.headers["content-type"]


def test_text_fields_and_file_names_of_a_real_form():
    raw, content_type = encoded({"model": "whisper", "stream": "true", "prompt": "ünïcode\r\nlines"},
                                {"file": ("clip.wav", AUDIO, "audio/wav")})  # fmt: skip
    assert form_fields(raw, content_type) == {"model": "whisper", "stream": "true", "prompt": "ünïcode\r\nlines",
                                              "file": "clip.wav"}  # fmt: skip
    quoted = content_type.replace("boundary=", 'boundary="') + '"'
    assert form_fields(raw, quoted)["model"] == "whisper"
    assert form_fields(b"preamble\r\n" + raw, content_type)["file"] == "clip.wav"


@pytest.mark.parametrize(
    ("raw", "content_type", "says"),
    [
        (b"{}", "application/json", "multipart/form-data"),
        (b"--x--", "multipart/form-data", "no boundary"),
        (b"no boundary here", "multipart/form-data; boundary=x", "does not hold its boundary"),
        (b'--x\r\nContent-Disposition: form-data; name="model"\r\n\r\nm', "multipart/form-data; boundary=x",
         "ends inside a part"),
    ],
)  # fmt: skip
def test_a_malformed_form_is_a_400_that_says_why(raw, content_type, says):
    with pytest.raises(GatewayError) as err:
        form_fields(raw, content_type)
    assert err.value.status == 400 and says in err.value.message
