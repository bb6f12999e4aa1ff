"""Built-in plugins, one per file under a folder per kind; importing this package registers them
all by type name. `support/` holds helpers that several plugins share and no plugin."""

import importlib
import pkgutil

for _kind in (
    "producers", "filters", "scorers", "pickers", "handlers", "deciders", "detectors", "parsers", "flowcontrol",
    "responders", "datalayer",
):  # fmt: skip
    _package = importlib.import_module(f"{__name__}.{_kind}")
    for _module in pkgutil.iter_modules(_package.__path__):
        importlib.import_module(f"{_package.__name__}.{_module.name}")
