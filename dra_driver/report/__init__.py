"""GPU-hours per team from Prometheus: the recording rules (rules.py) and `dra-driver report` (cli.py)."""
