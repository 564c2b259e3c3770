#!/usr/bin/env python3
"""Verifies a fork verdict bundle with third-party tools only, not with fork.

DSSE envelopes and ed25519 signatures: securesystemslib (PyPI); in-toto Statement v1
validation: in-toto-attestation (PyPI). Install them with

    python3 -m pip install 'securesystemslib[crypto]==1.6.0' 'in-toto-attestation==0.9.3'

Usage:

    python3 scripts/verify-bundle.py --node-key node.pub BUNDLE_DIR [--steward steward.pub]

It starts from the trusted node public key alone (a SubjectPublicKeyInfo PEM file, an
OpenSSH `ssh-ed25519` line, or `ed25519:<base64>`, as a file or a string) and follows the
chain: the node key verifies the endorsement (an in-toto statement of predicateType
https://fork.dev/endorsement/v1), the endorsement names the run's ephemeral key and the
digest of the verdict statement, the ephemeral key verifies the verdict (predicateType
https://fork.dev/verdict/v1). The key a verdict names about itself (`successor_key`) is
never used to verify anything: it must only agree with the endorsed one. Then the verdict
statement's subjects are checked against the bundle's files (verdict.json's bytes, the
patch's digest against the bundled patch.diff) and every artifact the verdict lists
against its file. With --steward, that steward's approval (`steward-<keyid>.dsse.json`, an
in-toto statement of predicateType https://fork.dev/approval/v1 whose subject is
verdict.json) is verified too.

Only the in-toto format (fork's schema 1.4 on) is accepted here; `fork verify` also reads
bundles of earlier versions. Exits 0 and prints `OK ...` when everything holds, otherwise
prints `REFUSED: <why>` on stderr and exits 1 (2 for usage errors).
"""
import argparse
import base64
import hashlib
import json
import os
import sys

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import (
    load_pem_public_key,
    load_ssh_public_key,
)
from google.protobuf import json_format
from in_toto_attestation.v1 import statement_pb2
from in_toto_attestation.v1.statement import Statement
from securesystemslib.dsse import Envelope
from securesystemslib.signer import SSlibKey

IN_TOTO_PAYLOAD_TYPE = "application/vnd.in-toto+json"
VERDICT_PREDICATE = "https://fork.dev/verdict/v1"
ENDORSEMENT_PREDICATE = "https://fork.dev/endorsement/v1"
APPROVAL_PREDICATE = "https://fork.dev/approval/v1"
MAX_JSON_BYTES = 64 << 20


class Refused(Exception):
    pass


def sha256_hex(data):
    return hashlib.sha256(data).hexdigest()


def raw_key(key):
    """The 32 raw bytes of an ed25519 public key object."""
    from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

    return key.public_bytes(Encoding.Raw, PublicFormat.Raw)


def parse_public_key(text, what):
    """An ed25519 public key from SPKI PEM, an OpenSSH line or `ed25519:<base64>`."""
    text = text.strip()
    try:
        if text.startswith("-----BEGIN PUBLIC KEY-----"):
            key = load_pem_public_key(text.encode())
        elif text.startswith("ssh-ed25519 "):
            key = load_ssh_public_key(text.encode())
        elif text.startswith("ed25519:"):
            raw = base64.b64decode(text[len("ed25519:"):], validate=True)
            key = Ed25519PublicKey.from_public_bytes(raw)
        else:
            raise ValueError("not a SubjectPublicKeyInfo PEM, ssh-ed25519 line or ed25519:<base64>")
    except Exception as e:  # noqa: BLE001 - any parse failure is a refusal
        raise Refused(f"{what}: not a usable ed25519 public key: {e}")
    if not isinstance(key, Ed25519PublicKey):
        raise Refused(f"{what}: not an ed25519 key")
    return key


def read_key_arg(arg, what):
    if os.path.isfile(arg):
        with open(arg, encoding="utf-8") as f:
            return parse_public_key(f.read(), f"{what} {arg}")
    return parse_public_key(arg, what)


def sslib_key(key):
    """The securesystemslib key for `key`, under fork's key id (the first 16 hex digits of
    the sha256 of the raw key: the envelopes' `keyid` hint, which securesystemslib matches)."""
    return SSlibKey.from_crypto(key, keyid=sha256_hex(raw_key(key))[:16], scheme="ed25519")


def fork_spelling(key):
    return "ed25519:" + base64.b64encode(raw_key(key)).decode()


def read_file(path):
    with open(path, "rb") as f:
        data = f.read(MAX_JSON_BYTES + 1)
    if len(data) > MAX_JSON_BYTES:
        raise Refused(f"{path}: larger than 64 MiB")
    return data


def verify_envelope(path, key, predicate_type):
    """Verifies the DSSE envelope at `path` with `key` alone, then validates its payload as
    an in-toto Statement v1 of `predicate_type`. Returns (payload bytes, statement dict)."""
    name = os.path.basename(path)
    try:
        envelope = Envelope.from_dict(json.loads(read_file(path)))
    except Refused:
        raise
    except Exception as e:  # noqa: BLE001
        raise Refused(f"{name}: not a DSSE envelope: {e}")
    if envelope.payload_type != IN_TOTO_PAYLOAD_TYPE:
        raise Refused(
            f"{name}: payloadType {envelope.payload_type!r}, expected {IN_TOTO_PAYLOAD_TYPE!r}"
        )
    try:
        envelope.verify([sslib_key(key)], 1)
    except Exception as e:  # noqa: BLE001
        raise Refused(f"{name}: the signature does not verify with {fork_spelling(key)}: {e}")
    try:
        pb = json_format.Parse(envelope.payload.decode("utf-8"), statement_pb2.Statement())
        Statement.copy_from_pb(pb).validate()
    except Exception as e:  # noqa: BLE001
        raise Refused(f"{name}: not a valid in-toto Statement v1: {e}")
    statement = json.loads(envelope.payload)
    if statement["predicateType"] != predicate_type:
        raise Refused(
            f"{name}: predicateType {statement['predicateType']!r}, expected {predicate_type!r}"
        )
    return envelope.payload, statement


def subject_digest(statement, name, what):
    found = [s for s in statement["subject"] if s.get("name") == name]
    if len(found) != 1 or "sha256" not in found[0].get("digest", {}):
        raise Refused(f"{what}: expected one subject {name!r} with a sha256 digest")
    return found[0]["digest"]["sha256"]


def same(what, a, b):
    if a != b:
        raise Refused(f"{what}: {a!r} != {b!r}")


def verify(bundle, node_key, steward_key=None):
    # 1. The endorsement, by the trusted node key.
    _, endorsement = verify_envelope(
        os.path.join(bundle, "endorsement.dsse.json"), node_key, ENDORSEMENT_PREDICATE
    )
    e = endorsement["predicate"]
    same("the endorsement's node_key", e["node_key"], fork_spelling(node_key))
    # 2. The ephemeral key it endorses (and only that one) verifies the verdict.
    ephemeral = parse_public_key(e["ephemeral_key"], "the endorsement's ephemeral_key")
    payload, statement = verify_envelope(
        os.path.join(bundle, "verdict.dsse.json"), ephemeral, VERDICT_PREDICATE
    )
    # 3. The endorsement is of this very statement and run.
    digest = sha256_hex(payload)
    same(
        "the endorsement's subject verdict-statement",
        subject_digest(endorsement, "verdict-statement", "endorsement"),
        digest,
    )
    same("the endorsement's statement_sha256", e["statement_sha256"], "sha256:" + digest)
    v = statement["predicate"]
    for field in ("run_id", "patch_hash", "task_hash"):
        same(f"the endorsement's {field}", e[field], v[field])
    same("the verdict's successor_key", v["successor_key"], e["ephemeral_key"])
    # 4. The subjects against the bundle's files.
    document = read_file(os.path.join(bundle, "verdict.json"))
    same(
        "subject verdict.json",
        subject_digest(statement, "verdict.json", "verdict"),
        sha256_hex(document),
    )
    same("verdict.json", json.loads(document), v)
    same("subject patch", "sha256:" + subject_digest(statement, "patch", "verdict"), v["patch_hash"])
    same("subject source", "sha256:" + subject_digest(statement, "source", "verdict"), v["source_hash"])
    patch = os.path.join(bundle, "artifacts", "patch.diff")
    if os.path.isfile(patch):
        same("subject patch vs artifacts/patch.diff", "sha256:" + sha256_hex(read_file(patch)), v["patch_hash"])
    # 5. Every artifact the signed verdict lists.
    for a in v["artifacts"]:
        path = os.path.join(bundle, a["path"])
        if os.path.islink(path) or not os.path.isfile(path):
            raise Refused(f"artifact {a['path']}: missing or not a regular file")
        data = read_file(path)
        same(f"artifact {a['path']} size", len(data), a["bytes"])
        same(f"artifact {a['path']} sha256", sha256_hex(data), a["sha256"])
    listed = {a["path"] for a in v["artifacts"]}
    art_dir = os.path.join(bundle, "artifacts")
    if os.path.isdir(art_dir):
        for name in os.listdir(art_dir):
            if f"artifacts/{name}" not in listed:
                raise Refused(f"artifacts/{name} is not listed in the verdict")
    # 6. The steward's approval, if asked.
    if steward_key is not None:
        keyid = sha256_hex(raw_key(steward_key))[:16]
        _, approval = verify_envelope(
            os.path.join(bundle, f"steward-{keyid}.dsse.json"), steward_key, APPROVAL_PREDICATE
        )
        a = approval["predicate"]
        same(
            "the approval's subject verdict.json",
            subject_digest(approval, "verdict.json", "approval"),
            sha256_hex(document),
        )
        same("the approval's verdict_sha256", a["verdict_sha256"], "sha256:" + sha256_hex(document))
        same("the approval's steward_key", a["steward_key"], fork_spelling(steward_key))
        for field in ("run_id", "patch_hash", "task_hash"):
            same(f"the approval's {field}", a[field], v[field])
    return v


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("bundle", help="the bundle directory")
    p.add_argument("--node-key", required=True, help="the trusted node public key (file or string)")
    p.add_argument("--steward", help="also verify this steward's approval (public key file or string)")
    args = p.parse_args()
    try:
        node_key = read_key_arg(args.node_key, "--node-key")
        steward = read_key_arg(args.steward, "--steward") if args.steward else None
        v = verify(args.bundle, node_key, steward)
    except Refused as e:
        print(f"REFUSED: {e}", file=sys.stderr)
        return 1
    except (OSError, KeyError, TypeError, ValueError) as e:
        print(f"REFUSED: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    print(
        f"OK {v['verdict']} run {v['run_id']} patch {v['patch_hash']}: endorsed by "
        f"{fork_spelling(node_key)}, signed by the endorsed key {v['successor_key']}"
        + (", approved by the steward" if steward else "")
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
