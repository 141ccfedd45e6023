//! The Kubernetes protobuf codec of the API server (`mcm_apiserver::protobuf::codec`): arbitrary bytes as the
//! message of a served built-in kind (or as a whole body). Must hold: no panic; whatever decodes encodes again, and
//! the second decode gives the same JSON (what a client sent is stored and answered unchanged).

use arbitrary::{Result, Unstructured};
use mcm_apiserver::protobuf::codec;

/// The kinds whose messages are fuzzed (each served kind, a list, and the Status of errors).
const KINDS: &[(&str, &str)] = &[
    ("v1", "Secret"),
    ("v1", "Namespace"),
    ("v1", "Node"),
    ("v1", "Pod"),
    ("v1", "PodList"),
    ("v1", "Event"),
    ("v1", "PersistentVolume"),
    ("v1", "PersistentVolumeClaim"),
    ("v1", "Status"),
    ("v1", "DeleteOptions"),
    ("events.k8s.io/v1", "Event"),
    ("coordination.k8s.io/v1", "Lease"),
    ("storage.k8s.io/v1", "VolumeAttachment"),
    ("policy/v1", "PodDisruptionBudget"),
    ("policy/v1", "Eviction"),
    ("certificates.k8s.io/v1", "CertificateSigningRequest"),
];

fn check(data: &[u8]) -> Result<()> {
    let mut u = Unstructured::new(data);
    let whole_body = u.ratio(1, 8)?;
    let (api_version, kind) = *u.choose(KINDS)?;
    let raw = u.take_rest();
    let decoded = if whole_body {
        codec::decode(raw)
    } else {
        codec::decode_raw(api_version, kind, raw)
    };
    let Ok(first) = decoded else { return Ok(()) };
    let body = codec::encode(&first)
        .unwrap_or_else(|err| panic!("a decoded {kind} does not encode: {err}\n{first}"));
    let second = codec::decode(&body).expect("an encoded object decodes");
    assert_eq!(first, second, "a decoded {kind} changed on its way back");
    Ok(())
}

/// Runs the codec on the bytes.
///
/// # Panics
///
/// When a decoded object does not encode, or does not decode to itself: the bug the target looks for.
pub fn run(data: &[u8]) {
    let _ = check(data);
}
