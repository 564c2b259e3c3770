"""A forger for tests/attestation.rs: rewrites a bundle's verdict (APPROVE, a new summary)
and signs it, with a fresh ed25519 key of its own that the new verdict names as its
`successor_key`, keeping the node's real endorsement. Every digest inside the forged
statement is consistent, so only a verifier that trusts the key a verdict names about
itself accepts it.

Usage: python3 forge_verdict.py BUNDLE_DIR
"""
import base64
import hashlib
import json
import os
import sys

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

bundle = sys.argv[1]
key = Ed25519PrivateKey.generate()
raw = key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
with open(os.path.join(bundle, "verdict.dsse.json"), encoding="utf-8") as f:
    envelope = json.load(f)
statement = json.loads(base64.b64decode(envelope["payload"]))
verdict = statement["predicate"]
verdict["verdict"] = "APPROVE"
verdict["evaluation_summary"] = "All good, trust me."
verdict["successor_key"] = "ed25519:" + base64.b64encode(raw).decode()
document = (json.dumps(verdict, indent=2) + "\n").encode()
for s in statement["subject"]:
    if s["name"] == "verdict.json":
        s["digest"]["sha256"] = hashlib.sha256(document).hexdigest()
statement["predicate"] = verdict
payload = json.dumps(statement, separators=(",", ":")).encode()
payload_type = envelope["payloadType"].encode()
pae = b"DSSEv1 %d %b %d %b" % (len(payload_type), payload_type, len(payload), payload)
forged = {
    "payload": base64.b64encode(payload).decode(),
    "payloadType": envelope["payloadType"],
    "signatures": [
        {
            "keyid": hashlib.sha256(raw).hexdigest()[:16],
            "sig": base64.b64encode(key.sign(pae)).decode(),
        }
    ],
}
with open(os.path.join(bundle, "verdict.json"), "wb") as f:
    f.write(document)
with open(os.path.join(bundle, "verdict.dsse.json"), "w", encoding="utf-8") as f:
    f.write(json.dumps(forged, indent=2) + "\n")
