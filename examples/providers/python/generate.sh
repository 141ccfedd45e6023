#!/bin/sh
# Generates generated/mcm/provider/v1/provider_pb2{,_grpc}.py from the repository's proto/ with grpcio-tools
# (pinned in requirements.txt). Run it after a change to proto/mcm/provider/v1/provider.proto; the cargo test
# crates/cli/tests/e2e/provider_python.rs fails while the stubs differ from what this script makes.
set -eu
here="$(cd "$(dirname "$0")" && pwd)"
out="${1:-$here/generated}"
proto="$here/../../../proto"
mkdir -p "$out"
python3 -m grpc_tools.protoc -I"$proto" --python_out="$out" --grpc_python_out="$out" \
    "$proto/mcm/provider/v1/provider.proto"
