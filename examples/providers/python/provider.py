#!/usr/bin/env python3
"""A machine provider in Python: in-memory VMs served over the mcm provider protocol (proto/mcm/provider/v1).

Serves on MC_ENDPOINT (unix:///abs/path.sock). A VM is Uninitialized after CreateMachine until InitializeMachine
succeeds (spec 002 section 11). Errors carry the machine code in a MachineCodeDetail, as the protocol asks.
"""
import json
import logging
import os
import signal
import sys
from concurrent import futures

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "generated"))
import grpc  # noqa: E402
from mcm.provider.v1 import provider_pb2 as pb, provider_pb2_grpc as rpc  # noqa: E402

NAME, SIZES = "python-example", ("small", "medium", "large")
CODES = {code.value[0]: code for code in grpc.StatusCode}
log = logging.getLogger(NAME)


class Fail(Exception):
    """A failed call: its machine code (0-17) and message."""

    def __init__(self, code, message):
        super().__init__(message)
        self.code, self.message = code, message


def answer(method):
    """Runs a call; a Fail ends it with the gRPC code (17 travels as UNKNOWN) and the code in the status details."""
    def call(self, request, context):
        try:
            return method(self, request, context)
        except Fail as fail:
            log.info("%s failed: code %d: %s", method.__name__, fail.code, fail.message)
            detail = pb.AnyDetail(type_url="type.googleapis.com/mcm.provider.v1.MachineCodeDetail",
                                  value=pb.MachineCodeDetail(code=fail.code).SerializeToString())
            grpc_code = CODES.get(fail.code, grpc.StatusCode.UNKNOWN)
            status = pb.StatusDetails(code=grpc_code.value[0], message=fail.message, details=[detail])
            context.set_trailing_metadata((("grpc-status-details-bin", status.SerializeToString()),))
            context.abort(grpc_code, fail.message)
    return call


def spec_of(request):
    """The class's providerSpec, validated: size (one of SIZES) and tags (a non-empty map) are mandatory."""
    spec = json.loads(request.machine_class or b"{}").get("providerSpec")
    if not isinstance(spec, dict):
        raise Fail(3, "providerSpec: must be an object with size and tags")
    if spec.get("size") not in SIZES:
        raise Fail(3, f"providerSpec.size: required, one of {', '.join(SIZES)}")
    tags = spec.get("tags")
    if not isinstance(tags, dict) or not tags or not all(isinstance(v, str) for v in tags.values()):
        raise Fail(3, "providerSpec.tags: required, a non-empty map of strings (the VMs of a cluster carry them)")
    return spec


class Driver(rpc.DriverServicer):
    def __init__(self):
        self.vms = {}  # (namespace, machine name) -> VM

    def _vm(self, request):
        """The spec, the VM's key, and the VM if it exists and belongs to the class's cluster (its tags)."""
        spec, machine = spec_of(request), json.loads(request.machine)["metadata"]
        key = (machine.get("namespace") or "default", machine["name"])
        vm = self.vms.get(key)
        return spec, key, vm if vm and spec["tags"].items() <= vm["spec"]["tags"].items() else None

    @answer
    def CreateMachine(self, request, context):
        spec, key, vm = self._vm(request)
        if vm is None:
            vm = {"id": f"python:///{key[0]}/{key[1]}", "node": key[1], "spec": spec, "initialized": False,
                  "ip": f"10.1.{len(self.vms) // 250}.{len(self.vms) % 250 + 1}"}
            self.vms[key] = vm
            log.info("created VM %s", vm["id"])
        elif vm["spec"] != spec:
            raise Fail(6, f"VM {vm['id']} exists with another providerSpec")
        return pb.CreateMachineResponse(provider_id=vm["id"], node_name=vm["node"], addresses=addresses(vm))

    @answer
    def InitializeMachine(self, request, context):
        vm = self._vm(request)[2] or fail_not_found(request)
        vm["initialized"] = True
        return pb.InitializeMachineResponse(provider_id=vm["id"], node_name=vm["node"], addresses=addresses(vm))

    @answer
    def DeleteMachine(self, request, context):
        _, key, vm = self._vm(request)
        if vm is not None:
            del self.vms[key]
            log.info("deleted VM %s", vm["id"])
        return pb.DeleteMachineResponse()

    @answer
    def GetMachineStatus(self, request, context):
        vm = self._vm(request)[2] or fail_not_found(request)
        if not vm["initialized"]:
            raise Fail(17, f"VM {vm['id']} is not initialized yet: call InitializeMachine")
        return pb.GetMachineStatusResponse(provider_id=vm["id"], node_name=vm["node"], addresses=addresses(vm))

    @answer
    def ListMachines(self, request, context):
        tags = spec_of(request)["tags"].items()
        return pb.ListMachinesResponse(machine_list={
            vm["id"]: name for (_, name), vm in self.vms.items() if tags <= vm["spec"]["tags"].items()})

    @answer
    def GetVolumeIDs(self, request, context):
        raise Fail(12, "GetVolumeIDs is not implemented by this provider")

    @answer
    def GenerateMachineClassForMigration(self, request, context):
        raise Fail(12, "GenerateMachineClassForMigration is not implemented by this provider")


def addresses(vm):
    return [pb.NodeAddress(type="InternalIP", address=vm["ip"]), pb.NodeAddress(type="Hostname", address=vm["node"])]


def fail_not_found(request):
    raise Fail(5, f"no VM for machine {json.loads(request.machine)['metadata']['name']}")


class Identity(rpc.IdentityServicer):
    def GetProviderInfo(self, request, context):
        return pb.GetProviderInfoResponse(name=NAME, version="0.1.0", protocol_version="v1", optional_methods=[
            "InitializeMachine", "GetMachineStatus", "ListMachines"])

    def Probe(self, request, context):
        return pb.ProbeResponse(ready=True)


def main():
    logging.basicConfig(level=os.environ.get("MC_LOG_LEVEL", "info").upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    endpoint = os.environ.get("MC_ENDPOINT", "")
    if not endpoint.startswith("unix:///"):
        print(f"{NAME}: misconfigured: MC_ENDPOINT: must be unix:///abs/path.sock, not {endpoint!r}", file=sys.stderr)
        sys.exit(2)
    path = endpoint[len("unix://"):]
    if os.path.exists(path):
        os.remove(path)  # a stale socket of a provider that died
    os.umask(0o077)  # the socket is reachable by its owner only
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=1))  # one call at a time: the VMs need no lock
    rpc.add_DriverServicer_to_server(Driver(), server)
    rpc.add_IdentityServicer_to_server(Identity(), server)
    server.add_insecure_port(f"unix:{path}")
    server.start()
    print(f"{NAME}: serving on {endpoint}", flush=True)
    signal.signal(signal.SIGTERM, lambda *_: server.stop(grace=5))
    try:
        server.wait_for_termination()
    except KeyboardInterrupt:
        server.stop(grace=5)


if __name__ == "__main__":
    main()
