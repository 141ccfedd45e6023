//! Patch application: JSON merge patch, JSON patch and strategic merge patch of arbitrary bodies to arbitrary
//! objects of the kinds the server patches. Must hold: no panic; a merge patch applied twice gives what it gave
//! once (RFC 7386 patches are idempotent).

use arbitrary::{Result, Unstructured};
use mcm_apiserver::patch::{self, PatchType};
use serde_json::{Value, json};

use crate::json;

const KINDS: &[&str] = &[
    "Machine",
    "MachineSet",
    "MachineDeployment",
    "Secret",
    "Node",
    "Pod",
    "Scale",
    "Lease",
];

fn body(u: &mut Unstructured<'_>, patch_type: PatchType) -> Result<Vec<u8>> {
    if u.ratio(1, 8)? {
        return u.arbitrary();
    }
    let value = if patch_type == PatchType::Json && u.ratio(3, 4)? {
        let mut ops = Vec::new();
        for _ in 0..u.int_in_range(0..=4)? {
            let op = *u.choose(&["add", "remove", "replace", "move", "copy", "test"])?;
            let mut path = String::new();
            for _ in 0..u.int_in_range(0..=3)? {
                path.push('/');
                path.push_str(&json::key(u)?);
            }
            ops.push(
                json!({ "op": op, "path": path, "from": json::string(u)?, "value": json::value(u, 2)? }),
            );
        }
        Value::Array(ops)
    } else {
        json::object(u)?
    };
    Ok(serde_json::to_vec(&value).unwrap_or_default())
}

/// Applies the patch the bytes describe.
///
/// # Panics
///
/// When a merge patch is not idempotent: the bug the target looks for.
pub fn run(data: &[u8]) {
    let mut u = Unstructured::new(data);
    let input = (|| -> Result<_> {
        let patch_type = *u.choose(&[PatchType::Merge, PatchType::Json, PatchType::Strategic])?;
        let kind = *u.choose(KINDS)?;
        let target = json::object(&mut u)?;
        let body = body(&mut u, patch_type)?;
        Ok((patch_type, kind, target, body))
    })();
    let Ok((patch_type, kind, target, body)) = input else {
        return;
    };
    if let Ok(patched) = patch::apply(patch_type, kind, &target, &body)
        && patch_type == PatchType::Merge
    {
        let again = patch::apply(patch_type, kind, &patched, &body)
            .expect("a merge patch that applied once applies twice");
        assert_eq!(again, patched, "a merge patch is idempotent");
    }
}
