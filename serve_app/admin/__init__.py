"""The operator's side: the admin routes behind the admin token (`api.py`) and how the command
line finds and reaches a running gateway (`operator_access.py`)."""
