"""Placeholder until the control-plane harness lands: no fixtures yet."""
