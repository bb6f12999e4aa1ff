"""A pods file: a YAML or JSON list of {name, address, port, labels, ...} (or {pods: [...]}),
checked entry by entry; every error names the file, the entry and the field."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from actors.options import PodSpec
from scheduler.config.nesting import MAX_FILE_NESTING, nests_deeper_than


class PodsFileError(ValueError):
    """A pods file that can not be used; the message names the file, the entry and the field."""


def load_pods_file(path: str | Path) -> list[PodSpec]:
    """Pods from a YAML or JSON file: a list of {name, address, port, labels}, or {pods: [...]}."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as err:
        raise PodsFileError(f"can not read pods file {str(path)!r}: {err.strerror}") from None
    except UnicodeDecodeError as err:
        raise PodsFileError(f"pods file {str(path)!r} is not UTF-8 text: {err}") from None
    kind = "JSON" if path.suffix == ".json" else "YAML"
    if nests_deeper_than(text):
        raise PodsFileError(f"pods file {str(path)!r}: the {kind} nests deeper than {MAX_FILE_NESTING} levels")
    try:
        data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (ValueError, yaml.YAMLError) as err:
        raise PodsFileError(f"pods file {str(path)!r} is not valid {kind}: {err}") from None
    except RecursionError:  # json's and PyYAML's parsers recurse once per nesting level
        raise PodsFileError(f"pods file {str(path)!r}: the {kind} nests deeper than the parser can follow") from None
    try:
        return parse_pods(data, where=f"pods file {str(path)!r}")
    except RecursionError:  # parsed just under the limit, then a field's validation went deeper
        raise PodsFileError(f"pods file {str(path)!r}: a value nests too deep") from None


def parse_pods(data: Any, where: str = "pods") -> list[PodSpec]:
    if isinstance(data, dict) and set(data) == {"pods"}:
        data = data["pods"]
    if not isinstance(data, list):
        raise PodsFileError(
            f"{where}: expected a list of pods ({{name, address, port, labels}}), got {type(data).__name__}"
        )
    specs: list[PodSpec] = []
    seen: set[str] = set()
    for i, entry in enumerate(data):
        named = isinstance(entry, dict) and entry.get("name")
        label = f"{where}: entry {i}" + (f" ({entry['name']!r})" if named else "")
        if not isinstance(entry, dict):
            raise PodsFileError(f"{label}: expected a mapping with name, address, port, labels")
        try:
            spec = PodSpec.model_validate(entry)
        except ValidationError as err:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in e['loc']) or 'entry'}: "
                + ("unknown field" if e["type"] == "extra_forbidden" else e["msg"])
                for e in err.errors()
            )
            raise PodsFileError(f"{label}: {problems}") from None
        if spec.name in seen:
            raise PodsFileError(f"{label}: name {spec.name!r} is used by an earlier entry")
        seen.add(spec.name)
        specs.append(spec)
    return specs
