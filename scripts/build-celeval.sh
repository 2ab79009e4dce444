#!/usr/bin/env bash
# Builds tools/celeval, Kubernetes' own DRA CEL, as the kube-scheduler compiles and evaluates selectors
# (tests/test_cel_differential.py); prints the binary's path (scripts/build-k8s-tool.sh).
exec "$(dirname "$0")/build-k8s-tool.sh" celeval "$@"
