"""The signature on a registry's ledger record (builder/image/reuse.py): who vouches for an image across runners.

An unsigned record binds digests, it does not sign them: anyone with push rights to the repository can push one
naming any image. So `builder publish` signs the record it pushes when CI gives it a private key, and a reader
whose matrix names the public key (`[defaults] ledger_public_key`) adopts only a record that key signed.

The envelope is DSSE (the in-toto / sigstore envelope cosign verifies), built and checked by securesystemslib's
own implementation (`securesystemslib.dsse.Envelope`: its PAE, its signer and key classes over pyca/cryptography);
nothing here is hand-rolled crypto:

    {"payloadType": "application/vnd.builder.image-ledger.v1+json",
     "payload": base64(the ledger entry's JSON), "signatures": [{"keyid": K, "sig": base64(signature over PAE)}]}

stored as the record's one layer, of media type application/vnd.dsse.envelope.v1+json. K is securesystemslib's
key id of the public key (a sha256 over the key); messages name its first 16 hex digits.

Keys: the private key is PEM text (PKCS#8, unencrypted: ECDSA P-256 or Ed25519, e.g. `openssl genpkey
-algorithm ed25519`) in the variable BUILDER_LEDGER_SIGNING_KEY, which CI holds as a secret; it is read, never
written anywhere, and redacted from every message (builder/net.py SECRET_VARIABLES). The public key is a PEM
file (SubjectPublicKeyInfo, what `openssl pkey -pubout` writes) the matrix names, relative to the matrix file.
"""

from __future__ import annotations

import binascii
import copy
import json
import os
from pathlib import Path

from .. import files
from ..errors import UserError

ENV = "BUILDER_LEDGER_SIGNING_KEY"
MATRIX_KEY = "ledger_public_key"  # under [defaults]
PAYLOAD_TYPE = "application/vnd.builder.image-ledger.v1+json"
DSSE_TYPE = "application/vnd.dsse.envelope.v1+json"
MAX_KEY_BYTES = 64 << 10
HOW_TO_SIGN = (f"name a public key in the matrix ([defaults] {MATRIX_KEY} = \"PATH.pub\") and give publish its "
               f"private key in {ENV} (PEM)")


def short(keyid: str) -> str:
    return keyid[:16]


def _kind(key) -> str:
    """'' for a key builder signs and verifies with (Ed25519, ECDSA P-256), else what it is: securesystemslib takes
    RSA of any size and other curves too, which the record's envelope was never meant to carry."""
    from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa

    if isinstance(key, (ed25519.Ed25519PublicKey, ed25519.Ed25519PrivateKey)):
        return ""
    if isinstance(key, (ec.EllipticCurvePublicKey, ec.EllipticCurvePrivateKey)):
        return "" if isinstance(key.curve, ec.SECP256R1) else f"ECDSA {key.curve.name}"
    if isinstance(key, (rsa.RSAPublicKey, rsa.RSAPrivateKey)):
        return f"RSA-{key.key_size}"
    return type(key).__name__.removeprefix("_").removesuffix("PublicKey").removesuffix("PrivateKey")


def _from_pem_public(data: bytes, where: str, path: Path):
    from cryptography.hazmat.primitives.serialization import load_pem_public_key

    key = load_pem_public_key(data)
    if kind := _kind(key):
        raise UserError(f"{where}: {path} holds a key of type {kind}; builder verifies with ECDSA P-256 or Ed25519 "
                        "only")
    from securesystemslib.signer import SSlibKey  # a refused key never pays for its import

    return SSlibKey.from_crypto(key)


def public_key(path: Path, where: str):
    """The public key of the PEM file at `path` (an SSlibKey); UserError naming `where` when it is not one. A FIFO,
    socket or device there is refused before it is opened (files.read_regular: reading one would block or never
    end), a directory or a file over MAX_KEY_BYTES too."""
    try:
        data = files.read_regular(path, MAX_KEY_BYTES)
    except OSError as exc:
        raise UserError(f"{where}: {path}: {exc.strerror or exc}; name a PEM public key file") from None
    if len(data) > MAX_KEY_BYTES or b"PRIVATE KEY" in data:
        raise UserError(f"{where}: {path} is not a PEM public key"
                        + (" (it holds a PRIVATE key: keep that in CI's secret " + ENV + ", never beside the matrix)"
                           if b"PRIVATE KEY" in data else ""))
    try:
        return _from_pem_public(data, where, path)
    except UserError:
        raise
    except Exception as exc:  # noqa: BLE001 - cryptography's parse errors, an unsupported key type
        raise UserError(f"{where}: {path} is not a PEM public key builder can verify with "
                        f"(ECDSA P-256 or Ed25519): {type(exc).__name__}") from None


def signer_from_env(environ=None):
    """The signer of BUILDER_LEDGER_SIGNING_KEY (a securesystemslib CryptoSigner), or None when it is unset.
    UserError when it is not an unencrypted PEM private key; the message never holds any of its value."""
    environ = os.environ if environ is None else environ
    text = environ.get(ENV, "")
    if not text.strip():
        return None
    from cryptography.hazmat.primitives.serialization import load_pem_private_key
    from securesystemslib.signer import CryptoSigner

    try:
        private = load_pem_private_key(text.encode(), password=None)
        kind = _kind(private)
        signer = None if kind else CryptoSigner(private)
    except Exception as exc:  # noqa: BLE001 - any parse error, an encrypted or unsupported key: never its text
        raise UserError(f"{ENV}: not an unencrypted PEM private key builder can sign with (PKCS#8, ECDSA P-256 or "
                        f"Ed25519; {type(exc).__name__})") from None
    if signer is None:
        raise UserError(f"{ENV}: a key of type {kind}; builder signs with ECDSA P-256 or Ed25519 only")
    return signer


def seal(payload: bytes, signer) -> bytes:
    """The DSSE envelope of `payload` (the ledger entry's JSON) signed by `signer`, as JSON bytes."""
    return (json.dumps(envelope(payload, PAYLOAD_TYPE, signer), indent=1, sort_keys=True) + "\n").encode()


def envelope(payload: bytes, payload_type: str, signer) -> dict:
    """The DSSE envelope of `payload` signed by `signer`, as a dict: {payload, payloadType, signatures}."""
    from securesystemslib.dsse import Envelope

    sealed = Envelope(payload, payload_type, {})
    sealed.sign(signer)
    return sealed.to_dict()


def unseal(raw: bytes, where: str, trusted) -> tuple[bytes | None, str, str]:
    """The payload of the DSSE envelope `raw`: (payload, "", signed_by) or (None, why, "").

    With `trusted` (the matrix's public key) the payload is returned only when a signature by that key verifies
    over the envelope's PAE (payload type and payload): signed_by is its key id. Without one nothing is verified:
    the payload is returned with signed_by "" (the registry's word)."""
    from securesystemslib.dsse import Envelope

    try:
        data = json.loads(raw)
    except (ValueError, RecursionError):
        return None, f"{where}: its DSSE envelope is not JSON", ""
    if not (isinstance(data, dict) and isinstance(data.get("payload"), str) and isinstance(data.get("payloadType"), str)
            and isinstance(data.get("signatures"), list)
            and all(isinstance(s, dict) and isinstance(s.get("keyid"), str) and isinstance(s.get("sig"), str)
                    for s in data["signatures"])):
        return None, f"{where}: not a DSSE envelope (payload, payloadType, signatures with keyid and sig)", ""
    if data["payloadType"] != PAYLOAD_TYPE:
        return None, f"{where}: its DSSE payload type is {data['payloadType'][:80]!r}, not {PAYLOAD_TYPE}", ""
    try:
        envelope = Envelope.from_dict(copy.deepcopy(data))
    except (ValueError, KeyError, TypeError, binascii.Error) as exc:
        return None, f"{where}: not a DSSE envelope ({type(exc).__name__})", ""
    except Exception as exc:  # noqa: BLE001 - securesystemslib's FormatError and kin
        return None, f"{where}: not a DSSE envelope ({type(exc).__name__})", ""
    if trusted is None:
        return envelope.payload, "", ""
    if not envelope.signatures:
        return None, f"{where} is unsigned (its envelope has no signature)", ""
    if trusted.keyid not in envelope.signatures:
        others = ", ".join(sorted(short(k) for k in envelope.signatures))
        return None, f"{where} is signed by key {others}, not by the matrix's key {short(trusted.keyid)}", ""
    try:
        envelope.verify([trusted], 1)
    except Exception:  # noqa: BLE001 - VerificationError; a malformed signature raises its own kind: refused alike
        return None, (f"{where}: its signature by key {short(trusted.keyid)} does not verify (its payload was edited "
                      "after it was signed, or the signature is not that key's)"), ""
    return envelope.payload, "", trusted.keyid


__all__ = ["DSSE_TYPE", "ENV", "HOW_TO_SIGN", "MATRIX_KEY", "PAYLOAD_TYPE", "public_key", "seal", "short",
           "signer_from_env", "unseal"]
