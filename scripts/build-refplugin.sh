#!/usr/bin/env bash
# Builds tools/refplugin, a reference DRA kubelet plugin on k8s.io/dynamic-resource-allocation/kubeletplugin
# (bench/bench_prepare.py's Go baseline); prints the binary's path (scripts/build-k8s-tool.sh).
exec "$(dirname "$0")/build-k8s-tool.sh" refplugin "$@"
