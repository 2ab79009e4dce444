#!/usr/bin/env bash
# Builds tools/metadatadecode, k8s.io/dynamic-resource-allocation's device metadata decoder (DecodeMetadataFromStream)
# and the Go kubelet plugin helper's encoding, the reference of tests/test_device_metadata.py; prints the binary's path
# (scripts/build-k8s-tool.sh).
exec "$(dirname "$0")/build-k8s-tool.sh" metadatadecode "$@"
