"""Where an EndpointPickerConfig comes from: a shipped config's name, a file, or YAML text.

Every front door (`epp up`, `epp validate`, `epp pick`, `serve run ... config=`, a Serve request
router's `request_router_kwargs={"config": ...}`) takes the same three forms, resolved here:
* a name (`default`, `gie-default`, `pd`, ...): the config of that name shipped in the package
  (`ray_epp/configs/<name>.yaml`, read with importlib.resources, so it is found in a wheel as in
  the source tree);
* YAML (or JSON) text: anything with a line break, or that starts with `{`;
* otherwise a path; a relative one is relative to the caller's working directory, and the error
  says which absolute path was tried."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from scheduler.errors import ConfigError

# The package whose *.yaml files are the shipped, named configs. Data only: read by name, not imported.
SHIPPED_CONFIGS = "ray_epp.configs"
DEFAULT_CONFIG_NAME = "default"


def shipped_config_names() -> list[str]:
    """The names of the configs shipped in the package, sorted."""
    return sorted(p.name.removesuffix(".yaml") for p in _shipped().iterdir() if p.name.endswith(".yaml"))


def is_config_text(spec: str) -> bool:
    """YAML or JSON text rather than a name or a path."""
    return "\n" in spec or spec.lstrip().startswith("{")


def config_source(spec: str | Path) -> tuple[str, str]:
    """(the config's text, where it came from: `shipped config 'pd'`, a file's absolute path, or
    `YAML text`). Raises ConfigError naming what was tried."""
    if isinstance(spec, str):
        if is_config_text(spec):
            return spec, "YAML text"
        if spec in shipped_config_names():
            return (_shipped() / f"{spec}.yaml").read_text(encoding="utf-8"), f"shipped config {spec!r}"
    path = Path(spec).expanduser()
    tried = path if path.is_absolute() else Path.cwd() / path
    try:
        return tried.read_text(encoding="utf-8"), str(tried)
    except FileNotFoundError:
        names = ", ".join(shipped_config_names())
        raise ConfigError(
            [f"no config {str(spec)!r}: not a shipped config ({names}) and no file at {str(tried)!r}"]
        ) from None
    except OSError as err:
        raise ConfigError([f"can not read config file {str(tried)!r}: {err.strerror}"]) from None
    except UnicodeDecodeError as err:
        raise ConfigError([f"config file {str(tried)!r} is not UTF-8 text: {err}"]) from None


def shipped_config_path(name: str = DEFAULT_CONFIG_NAME) -> str:
    """A shipped config's file, for a reader that wants a path (shown in help texts and logs)."""
    return str(_shipped() / f"{name}.yaml")


def _shipped():
    return resources.files(SHIPPED_CONFIGS)
