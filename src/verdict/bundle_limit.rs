//! The bundle's size limit, shared by the writer and the reader: `fork verify` reads no
//! JSON file of a bundle larger than [`MAX_JSON_BYTES`], and the writer never writes one.
//! A verdict whose document or signed envelope would be larger (metrics without end: a
//! plan of many tasks, each with thousands of metrics with long names) is recorded instead
//! as [`too_large_to_record`] says: its metric listings left out, never an approval. Only
//! one still too large after that is refused, as an error naming the sizes.

use super::bundle_error::BundleError;
use super::decide::wording::short;
use super::sign;
use super::{Verdict, VerdictKind};
use crate::identity::SigningIdentity;

/// Largest JSON file of a bundle that `fork verify` reads, and that a bundle holds.
pub const MAX_JSON_BYTES: u64 = 64 << 20;

/// The confidence of the NEEDS_REVISION an approval too large to record becomes: the
/// strength of a metrics file that could not be used (0.4), as `decide` weighs it.
const TOO_LARGE_CONFIDENCE: f64 = 0.7;

/// Caveats kept when a verdict is too large to record whole.
const KEPT_CAVEATS: usize = 20;

/// A verdict signed: the verdict as signed, its document, its envelope (as written) and
/// the envelope's payload (what the endorsement names).
pub(super) struct Signed {
    pub verdict: Verdict,
    pub document: Vec<u8>,
    pub envelope: Vec<u8>,
    pub payload: Vec<u8>,
}

/// `verdict` (validated) signed by `ephemeral`, its document and envelope each at most
/// `limit` bytes: recorded as [`too_large_to_record`] says when they would be larger,
/// refused ([`BundleError::TooLarge`]) when even that is.
pub(super) fn sign_within(
    verdict: Verdict,
    ephemeral: &dyn SigningIdentity,
    limit: u64,
) -> Result<Signed, BundleError> {
    let sign = |verdict: Verdict| -> Result<(Signed, u64), BundleError> {
        verdict.validate().map_err(BundleError::Invalid)?;
        let document = verdict.to_json_pretty()?;
        let (envelope, payload) = sign::sign_verdict(&verdict, &document, ephemeral)?;
        let envelope = envelope.to_json_pretty()?;
        let largest = document.len().max(envelope.len()) as u64;
        let signed = Signed {
            verdict,
            document,
            envelope,
            payload,
        };
        Ok((signed, largest))
    };
    let (signed, largest) = sign(verdict)?;
    if largest <= limit {
        return Ok(signed);
    }
    let (signed, smaller) = sign(too_large_to_record(signed.verdict, largest, limit))?;
    if smaller <= limit {
        return Ok(signed);
    }
    Err(BundleError::TooLarge {
        bytes: largest,
        without_metrics: smaller,
        limit,
    })
}

/// What is recorded of a verdict whose signed files would be `bytes`, over the `limit` a
/// verifier reads: the same verdict without its metric listings (the verdict's and each
/// task's) and with at most [`KEPT_CAVEATS`] caveats, its summary saying so first; an
/// APPROVE becomes NEEDS_REVISION (it rested on metrics no one could check), a REJECT or
/// NEEDS_REVISION stays. Tests, budget, isolation, artifacts and hashes are kept.
pub(super) fn too_large_to_record(mut v: Verdict, bytes: u64, limit: u64) -> Verdict {
    let metrics = v.metrics.len() + v.plan.iter().map(|t| t.metrics.len()).sum::<usize>();
    let approve = v.verdict == VerdictKind::Approve;
    if approve {
        v.verdict = VerdictKind::NeedsRevision;
        v.confidence = TOO_LARGE_CONFIDENCE;
    }
    v.evaluation_summary = format!(
        "The verdict is too large to record whole ({bytes} bytes, over the {limit} bytes a \
         bundle's file may hold, with {metrics} metric entries): its metrics are left out{}. \
         Report fewer metrics, with shorter names. It said: {}",
        if approve {
            ", and an approval cannot rest on metrics no one can check"
        } else {
            ""
        },
        short(&v.evaluation_summary, 1000)
    );
    v.metrics.clear();
    for t in &mut v.plan {
        t.metrics.clear();
        t.summary = short(&t.summary, 1000);
        // Each task's approval rested on those metrics too.
        if t.verdict == Some(VerdictKind::Approve) {
            t.verdict = Some(VerdictKind::NeedsRevision);
            t.confidence = Some(TOO_LARGE_CONFIDENCE);
            t.summary = format!(
                "Its metrics were left out of a verdict too large to record whole. It said: {}",
                t.summary
            );
        }
    }
    let left_out = v.caveats.len().saturating_sub(KEPT_CAVEATS);
    v.caveats.truncate(KEPT_CAVEATS);
    for c in &mut v.caveats {
        *c = short(c, 1000);
    }
    if left_out > 0 {
        v.caveats.push(format!(
            "{left_out} more caveats left out (the verdict was too large)"
        ));
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::identity::{EphemeralKey, NodeKey};
    use crate::verdict::Metric;

    /// A verdict with `n` metrics with names of 500 characters, listed for the verdict and
    /// its one task.
    fn many_metrics(key: &crate::identity::PublicKey, n: usize) -> Verdict {
        let mut v = crate::verdict::tests::sample_verdict(key);
        v.metrics = (0..n)
            .map(|i| Metric {
                name: format!("{i:05}{}", "m".repeat(495)),
                baseline: Some(1.0),
                patched: 1.0,
                change: Some(0.0),
                ..Metric::default()
            })
            .collect();
        v.caveats = (0..50).map(|i| format!("caveat {i}")).collect();
        if let Some(t) = v.plan.first_mut() {
            t.metrics = v.metrics.clone();
        }
        v
    }

    /// Over the limit: recorded without metrics, never an approval, within the limit, and
    /// the bundle of such a verdict verifies. Within it: signed as it is.
    #[test]
    fn a_verdict_over_the_limit_is_recorded_without_its_metrics() {
        let eph = EphemeralKey::generate();
        let mut v = many_metrics(&eph.public(), 400);
        v.successor_key = eph.public().to_string();
        let whole = sign_within(v.clone(), &eph, MAX_JSON_BYTES).unwrap();
        assert_eq!(whole.verdict, v);
        let limit = 128 << 10;
        let signed = sign_within(v.clone(), &eph, limit).unwrap();
        let r = &signed.verdict;
        assert_eq!(r.verdict, VerdictKind::NeedsRevision);
        assert_eq!(r.confidence, TOO_LARGE_CONFIDENCE);
        assert!(r.metrics.is_empty() && r.plan.iter().all(|t| t.metrics.is_empty()));
        assert!(!r.plan.is_empty(), "the sample verdict has a plan");
        for t in &r.plan {
            assert_eq!(t.verdict, Some(VerdictKind::NeedsRevision), "{t:?}");
        }
        assert!(
            r.evaluation_summary
                .starts_with("The verdict is too large to record whole")
                && r.evaluation_summary.contains("800 metric entries")
                && r.evaluation_summary.contains(&v.evaluation_summary),
            "{}",
            r.evaluation_summary
        );
        assert_eq!(r.caveats.len(), KEPT_CAVEATS + 1);
        assert!(signed.document.len() as u64 <= limit);
        assert!(signed.envelope.len() as u64 <= limit);
        assert_eq!(r.to_json_pretty().unwrap(), signed.document);
        // A REJECT stays a REJECT.
        let mut reject = v.clone();
        reject.verdict = VerdictKind::Reject;
        reject.confidence = 1.0;
        let r = sign_within(reject, &eph, limit).unwrap().verdict;
        assert_eq!((r.verdict, r.confidence), (VerdictKind::Reject, 1.0));
        // Still too large without metrics: refused, naming the sizes.
        let e = sign_within(v, &eph, 1024).err().expect("refused");
        assert!(
            matches!(e, BundleError::TooLarge { limit: 1024, .. }),
            "{e}"
        );

        // The writer applies the reader's limit: a verdict over it is written recorded so,
        // and `fork verify`'s reader accepts the bundle.
        let mut huge = many_metrics(&eph.public(), 0);
        let name = "n".repeat(500);
        // Over the limit in verdict.json alone (the envelope, base64 of the compact
        // statement, is larger still).
        let count = (MAX_JSON_BYTES as usize) / name.len() + 1;
        huge.metrics = (0..count)
            .map(|i| Metric {
                name: format!("{i:07}{name}"),
                patched: 1.0,
                ..Metric::default()
            })
            .collect();
        let node = NodeKey::generate();
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("b");
        let w = crate::verdict::write_bundle(&out, &huge, &[], &eph, &node).unwrap();
        assert_eq!(w.verdict.verdict, VerdictKind::NeedsRevision);
        assert!(w.verdict.metrics.is_empty());
        let verified = crate::verdict::verify_bundle(&out, &[node.public()]).unwrap();
        assert_eq!(verified.verdict.verdict, VerdictKind::NeedsRevision);
    }
}
