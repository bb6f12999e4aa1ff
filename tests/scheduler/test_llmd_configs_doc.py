"""docs/LLMD_CONFIGS.md stays true: its plugin table lists every llm-d type the tests know, with the
status the registry and the refusal table give today."""

from __future__ import annotations

import re
from pathlib import Path

from scheduler.config.refused import REFUSED
from scheduler.registry import plugin_class
from tests.scheduler.test_llmd_refused import LLMD_TYPES

DOC = Path(__file__).parents[2] / "docs" / "LLMD_CONFIGS.md"


def test_the_plugin_table_matches_the_registry():
    rows = dict(re.findall(r"^\| `([a-z0-9-]+)` \| (runs|refused) \|", DOC.read_text(), re.M))
    assert sorted(rows) == sorted({*LLMD_TYPES, "models-responder"})
    for type_name, status in rows.items():
        assert status == ("runs" if plugin_class(type_name) is not None else "refused"), type_name
        assert status == "runs" or type_name in REFUSED
