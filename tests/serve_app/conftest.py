"""Fixtures the gateway tests share. A test module brings up its own `gateway` (an EppDeployment
for its config and pods); `client` is an HTTP client of that gateway, fresh for each test."""

from __future__ import annotations

import httpx
import pytest


@pytest.fixture()
def client(gateway):
    with httpx.Client(base_url=gateway.url, timeout=60) as c:
        yield c
