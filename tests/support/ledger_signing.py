"""What the two halves of test_ledger_signing.py share: tests/unit/image/test_ledger_signing.py (its tests that need
no Docker) and tests/docker/image/test_ledger_signing.py (those that do). Written by scripts/layout-tests."""

from __future__ import annotations

from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519

from builder.image import signing

DIGEST = "sha256:" + "d" * 64
FORGED = "sha256:" + "f" * 64
KEY = "c" * 64


def pair(kind: str = "ecdsa") -> tuple[str, bytes]:
    """(private key PEM text, public key PEM bytes), made here."""
    private = ec.generate_private_key(ec.SECP256R1()) if kind == "ecdsa" else ed25519.Ed25519PrivateKey.generate()
    pem = private.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption()).decode()
    pub = private.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    return pem, pub


def keys(tmp: Path, kind: str = "ecdsa"):
    pem, pub = pair(kind)
    (tmp / f"{kind}.pub").write_bytes(pub)
    return signing.signer_from_env({signing.ENV: pem}), signing.public_key(tmp / f"{kind}.pub", "test"), pem
