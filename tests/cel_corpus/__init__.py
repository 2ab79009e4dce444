"""The CEL differential corpus: devices, hand-written selectors, a seeded generator, and the two evaluators.

`tests/test_cel_differential.py` runs every case through `dra_driver.cel` and through Kubernetes' own DRA CEL
(tools/celeval) and compares the outcomes: true, false, compile_error, runtime_error.
"""
