#!/usr/bin/env python3
"""Writes crates/apiserver/proto/k8s.proto: the protobuf schema of the built-in kinds the embedded API server
serves, for its generic JSON <-> protobuf converter (crates/apiserver/src/protobuf).

The field numbers and types come from the prost messages of the `k8s-pb` crate and the JSON field names from the
serde code of `k8s-openapi` (the Kubernetes proto field names are the JSON names, which prost turns into snake case),
both read from the local cargo registry. Only the messages reachable from ROOTS are written.

Usage: python3 scripts/gen-k8s-proto.py [K8S_PB_DIR] [K8S_OPENAPI_DIR]
"""

import glob
import os
import re
import sys

HOME = os.environ.get("CARGO_HOME", os.path.expanduser("~/.cargo"))
PB = sys.argv[1] if len(sys.argv) > 1 else sorted(glob.glob(f"{HOME}/registry/src/*/k8s-pb-0.9.*"))[-1]
OPENAPI = sys.argv[2] if len(sys.argv) > 2 else sorted(glob.glob(f"{HOME}/registry/src/*/k8s-openapi-0.29.*"))[-1]
OUT = os.path.join(os.path.dirname(__file__), "..", "crates", "apiserver", "proto", "k8s.proto")

# The top-level messages: the served kinds and their lists, and what the wire format and the verbs need.
ROOTS = [
    "api.core.v1." + k
    for k in ["Namespace", "NamespaceList", "Node", "NodeList", "Pod", "PodList", "Secret", "SecretList",
              "Event", "EventList", "PersistentVolume", "PersistentVolumeList", "PersistentVolumeClaim",
              "PersistentVolumeClaimList"]
] + [
    "api.events.v1.Event", "api.events.v1.EventList",
    "api.coordination.v1.Lease", "api.coordination.v1.LeaseList",
    "api.storage.v1.VolumeAttachment", "api.storage.v1.VolumeAttachmentList",
    "api.policy.v1.PodDisruptionBudget", "api.policy.v1.PodDisruptionBudgetList", "api.policy.v1.Eviction",
    "api.certificates.v1.CertificateSigningRequest", "api.certificates.v1.CertificateSigningRequestList",
    "apimachinery.pkg.apis.meta.v1.Status", "apimachinery.pkg.apis.meta.v1.DeleteOptions",
    "apimachinery.pkg.apis.meta.v1.WatchEvent", "apimachinery.pkg.runtime.Unknown",
]


def norm(name):
    """Struct and field names compared without case and underscores: prost writes `FcVolumeSource`/`pod_cid_rs`
    where k8s-openapi writes `FCVolumeSource`/`pod_cidrs`."""
    return name.replace("_", "").lower()


def json_names():
    """(struct, rust field) -> JSON name, from k8s-openapi's deserializers (`"podIP" => Field::Key_pod_ip`), of
    its newest Kubernetes version; the set of the structs it knows."""
    names, structs = {}, set()
    version = max((v for v in os.listdir(os.path.join(OPENAPI, "src")) if v.startswith("v1_")),
                  key=lambda v: int(v[3:]))
    for path in glob.glob(os.path.join(OPENAPI, "src", version, "**", "*.rs"), recursive=True):
        with open(path) as f:
            text = f.read()
        struct = re.search(r"pub struct (\w+)", text)
        if not struct:
            continue
        structs.add(norm(struct.group(1)))
        for json, rust in re.findall(r'"([A-Za-z0-9_$\-]+)" => Field::Key_(\w+)', text):
            names.setdefault((norm(struct.group(1)), norm(rust)), json)
            names.setdefault(("*", norm(rust)), json)
    return names, structs


def camel(snake):
    head, *rest = snake.split("_")
    return head + "".join(p[:1].upper() + p[1:] for p in rest)


FIELD = re.compile(
    r"#\[prost\((?P<attr>[^\]]*)\)\]\s*pub (?P<name>(?:r#)?\w+):\s*(?P<ty>[^;]*?),\s*(?=(?:///|#\[prost|\}))",
    re.S,
)
STRUCT = re.compile(r"pub struct (\w+) \{(.*?)\n\}", re.S)


def parse():
    messages = {}
    for path in glob.glob(os.path.join(PB, "src", "**", "mod.rs"), recursive=True):
        module = os.path.relpath(os.path.dirname(path), os.path.join(PB, "src")).split(os.sep)
        with open(path) as f:
            text = f.read()
        for name, body in STRUCT.findall(text):
            fields = []
            for m in FIELD.finditer(body + "\n}"):
                fields.append((m.group("attr"), m.group("name").removeprefix("r#"), m.group("ty")))
            messages[".".join(module + [name])] = (module, fields)
    return messages


def resolve(module, ty):
    """The full name of the message a Rust type path names, seen from `module`."""
    ty = re.sub(r"\s+", "", ty)
    for wrapper in ["::core::option::Option<", "::prost::alloc::vec::Vec<", "::prost::alloc::boxed::Box<"]:
        while ty.startswith(wrapper):
            ty = ty[len(wrapper):-1]
    parts = ty.split("::")
    base = list(module)
    while parts and parts[0] == "super":
        base.pop()
        parts.pop(0)
    return ".".join(base + parts)


def proto_name(full):
    return full.replace(".", "_")


def main():
    names, structs = json_names()
    messages = parse()
    out, seen, queue = [], set(), list(ROOTS)
    while queue:
        full = queue.pop(0)
        if full in seen:
            continue
        seen.add(full)
        module, fields = messages[full]
        lines = [f"message {proto_name(full)} {{"]
        for attr, rust, ty in fields:
            tag = re.search(r'tag = "(\d+)"', attr).group(1)
            struct = norm(full.rsplit(".", 1)[1])
            json = names.get((struct, norm(rust)))
            target = resolve(module, ty).rsplit(".", 1)[1] if attr.startswith("message") else ""
            embedded = target.endswith(camel(rust)[:1].upper() + camel(rust)[1:])
            if json is None and struct in structs and embedded:
                # A struct k8s-openapi knows, without this field named for its type: Go embeds it
                # (`json:",inline"`), as Volume does its VolumeSource; the codec flattens `inline_` fields.
                json = "inline_" + camel(rust)
            elif json is None:
                json = names.get(("*", norm(rust)), camel(rust))
            kind = attr.split(",")[0].strip()
            if kind.startswith("btree_map"):
                key, value = [p.strip() for p in re.search(r'"([^"]*)"', attr).group(1).split(",")]
                if value == "message":
                    inner = re.sub(r"\s+", "", ty)
                    inner = inner[inner.index(",") + 1:-1].rstrip(",")
                    target = resolve(module, inner)
                    queue.append(target)
                    value = proto_name(target)
                lines.append(f"  map<{key}, {value}> {json} = {tag};")
                continue
            label = "repeated" if "repeated" in attr else "optional"
            if kind == "message":
                target = resolve(module, ty)
                queue.append(target)
                kind = proto_name(target)
            elif kind.startswith("bytes"):
                kind = "bytes"
            lines.append(f"  {label} {kind} {json} = {tag};")
        lines.append("}")
        out.append("\n".join(lines))
    header = (
        "// Generated by scripts/gen-k8s-proto.py from the k8s-pb crate's messages (field numbers, types) and\n"
        "// k8s-openapi's JSON names; do not edit. The Kubernetes wire schema of the built-in kinds the embedded API\n"
        "// server serves, for its generic JSON <-> protobuf converter. Kubernetes API: Apache-2.0.\n"
        'syntax = "proto2";\n\npackage k8s;\n'
    )
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    with open(OUT, "w") as f:
        f.write(header + "\n" + "\n\n".join(sorted(out)) + "\n")
    print(f"{len(out)} messages -> {os.path.normpath(OUT)}")


main()
