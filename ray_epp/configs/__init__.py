"""The EndpointPickerConfigs shipped with Ray EPP, one YAML file per name (`default`, `pd`, ...).

Data only: named anywhere a config is taken (`epp up --config pd`, `request_router_kwargs=
{"config": "lora"}`) and read with importlib.resources (scheduler/config/source.py)."""
