#!/usr/bin/env python3
"""Asks any provider on MC_ENDPOINT (unix:///abs/path.sock) who it is and whether it is ready, then the status of a
machine sent without its class, which a provider refuses (InvalidArgument, 3): a check from Python that a provider
speaks the protocol, and how a client reads the machine code of an error (a MachineCodeDetail in the status details
wins over the gRPC code: that is how 17 Uninitialized travels).
"""
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "generated"))
import grpc  # noqa: E402
from mcm.provider.v1 import provider_pb2 as pb, provider_pb2_grpc as rpc  # noqa: E402

DETAIL = "type.googleapis.com/mcm.provider.v1.MachineCodeDetail"


def machine_code(error):
    """The machine code of a failed call: the detail's when present, else the gRPC code's number."""
    for key, value in error.trailing_metadata() or ():
        if key == "grpc-status-details-bin":
            for detail in pb.StatusDetails.FromString(value).details:
                if detail.type_url == DETAIL:
                    return pb.MachineCodeDetail.FromString(detail.value).code
    return error.code().value[0]


def main():
    endpoint = os.environ.get("MC_ENDPOINT", "")
    if not endpoint.startswith("unix:///"):
        print(f"MC_ENDPOINT: must be unix:///abs/path.sock, not {endpoint!r}", file=sys.stderr)
        sys.exit(2)
    with grpc.insecure_channel(endpoint) as channel:
        identity = rpc.IdentityStub(channel)
        info = identity.GetProviderInfo(pb.GetProviderInfoRequest(), timeout=10)
        print(f"name: {info.name}\nprotocol: {info.protocol_version}\noptional: {', '.join(info.optional_methods)}")
        print(f"ready: {identity.Probe(pb.ProbeRequest(), timeout=10).ready}")
        machine = {"metadata": {"name": "python-client-probe", "namespace": "default"}}
        try:
            rpc.DriverStub(channel).GetMachineStatus(pb.MachineRequest(machine=json.dumps(machine).encode()),
                                                      timeout=10)
            print("status without a class: OK")
        except grpc.RpcError as error:
            print(f"status without a class: code {machine_code(error)}: {error.details()}")


if __name__ == "__main__":
    main()
