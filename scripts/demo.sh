#!/usr/bin/env bash
# The main job: build mcm, run `mcm up` (the embedded API server, the local provider whose machines are local
# process trees running `mcm node-agent`, and every controller), apply the example manifests unchanged with kubectl,
# wait until the Machine, the MachineSet and the MachineDeployment run with Ready nodes, roll the deployment to
# local-medium, and show everything. At the end `mcm down --purge` stops every machine and removes all state,
# unless --keep is given (then: export KUBECONFIG=DATA_DIR/kubeconfig, and `mcm down --data-dir DATA_DIR --purge`).
# Usage: scripts/demo.sh [--keep] [DATA_DIR]   (default: a fresh temporary directory)
# Needs no terminal (`bash scripts/demo.sh </dev/null >demo.log 2>&1` works). The binary is built into
# $CARGO_TARGET_DIR when set, else target/; MCM_EXAMPLES names another folder of manifests (default examples/local).
set -euo pipefail
cd "$(dirname "$0")/.."

keep=""
if [ "${1:-}" = "--keep" ]; then keep=1; shift; fi
examples="${MCM_EXAMPLES:-examples/local}"
[ -d "$examples" ] || { echo "examples not found at $examples (set MCM_EXAMPLES)" >&2; exit 1; }
command -v kubectl >/dev/null || { echo "kubectl is needed" >&2; exit 1; }
# No pager, no colour, no prompt: the output may be a file.
export KUBECTL_PAGER="" PAGER=cat NO_COLOR=1

echo "building mcm (cargo build -p mcm; the first build takes a few minutes) ..."
cargo build -p mcm
target_dir="${CARGO_TARGET_DIR:-target}"
case "$target_dir" in /*) ;; *) target_dir="$PWD/$target_dir" ;; esac
mcm="$target_dir/debug/mcm"
[ -x "$mcm" ] || { echo "the build left no binary at $mcm" >&2; exit 1; }
echo "starting $mcm up ..."
data_dir="${1:-$(mktemp -d "${TMPDIR:-/tmp}/mcm-demo.XXXXXX")}"
"$mcm" up --data-dir "$data_dir" --node-heartbeat-interval 2s >"$data_dir.log" 2>&1 &
up=$!
if [ -z "$keep" ]; then
    trap '"$mcm" down --data-dir "$data_dir" --purge >/dev/null 2>&1 || kill "$up" 2>/dev/null; wait "$up" 2>/dev/null || true' EXIT
fi

export KUBECONFIG="$data_dir/kubeconfig"
for _ in $(seq 1200); do
    grep -q "mcm up: ready" "$data_dir.log" 2>/dev/null && break
    kill -0 "$up" 2>/dev/null || { cat "$data_dir.log" >&2; exit 1; }
    sleep 0.1
done
grep -q "mcm up: ready" "$data_dir.log" || { cat "$data_dir.log" >&2; exit 1; }

kubectl apply -f "$examples"
wait_running() { # $1: how many machines, $2: what
    for _ in $(seq 600); do
        phases="$(kubectl get machines -o jsonpath='{range .items[*]}{.status.currentStatus.phase}{"\n"}{end}')"
        if [ "$(grep -c . <<<"$phases")" -eq "$1" ] && ! grep -qv '^Running$' <<<"$phases"; then return 0; fi
        sleep 0.2
    done
    echo "timed out waiting for $2" >&2; kubectl get mc >&2; exit 1
}
wait_available() { # the deployment's status says so too (its status follows the machines' a moment later)
    kubectl wait --for=jsonpath='{.status.availableReplicas}'=3 machinedeployment/workers --timeout=60s >/dev/null
}
wait_running 6 "the Machine, the MachineSet's and the MachineDeployment's machines to run"
kubectl wait --for=condition=Ready nodes --all --timeout=60s >/dev/null
wait_available
kubectl get mcd,mcs,mc,nodes
echo
echo "rolling the deployment to local-medium ..."
kubectl patch machinedeployment workers --type merge -p '{"spec":{"template":{"spec":{"class":{"name":"local-medium"}}}}}'
for _ in $(seq 600); do
    [ "$(kubectl get machines -l name=workers -o jsonpath='{range .items[*]}{.spec.class.name}/{.status.currentStatus.phase}{"\n"}{end}' | grep -c '^local-medium/Running$')" -eq 3 ] &&
        [ "$(kubectl get machines -l name=workers --no-headers | wc -l)" -eq 3 ] && break
    sleep 0.2
done
wait_running 6 "the rolled deployment"
wait_available
kubectl get mcd,mcs,mc,nodes
echo
if [ -n "$keep" ]; then
    echo "mcm up keeps running (pid $up): export KUBECONFIG=$KUBECONFIG"
    echo "stop it with: $mcm down --data-dir $data_dir --purge"
else
    echo "data in $data_dir (log: $data_dir.log); stopping: mcm down --purge"
fi
