#!/usr/bin/env bash
# Builds tools/allocbench, the kube-scheduler's structured allocator on JSON input (bench/bench_allocator.py's
# Go baseline); prints the binary's path (scripts/build-k8s-tool.sh).
exec "$(dirname "$0")/build-k8s-tool.sh" allocbench "$@"
