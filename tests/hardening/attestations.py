"""The bad-input table for `builder verify` (issue 49), in the table's form (tests/hardening/cases.py's Case: the real
CLI, its exit code, the words of its one-line message, no traceback, nothing written). Every case is refused before
any request, but the registry that does not answer (exit 3); publish's --sbom-format and --no-attestations are refused
before anything is built.

Keys are real PEM files made here (cryptography): a public key that is the wrong kind, a private key where a public
key belongs, text that is no key. Policies are TOML files with each field wrong in turn."""

from __future__ import annotations

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from tests.hardening.cases import PUBLISH, Case, fifo

REF = "127.0.0.1:9/builder-hardening/vllm@sha256:" + "a" * 64  # nothing listens on port 9
VERIFY = ["verify", REF, "--key", "{tmp}/ci.pub"]


def _public(key) -> bytes:
    return key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)


_EC = ec.generate_private_key(ec.SECP256R1())
GOOD = _public(_EC)
PRIVATE = _EC.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
RSA = _public(rsa.generate_private_key(public_exponent=65537, key_size=2048))
KEYS = {"ci.pub": GOOD}


def policy(text: str) -> dict:
    return {**KEYS, "policy.toml": text}


CASES: list[Case] = [
    Case("v49-verify-no-key", "shape", ["verify", REF], expect=("name the publisher's public key",)),
    Case("v49-verify-ref-malformed", "inject", ["verify", "127.0.0.1:9/x y@sha256:1", "--key", "{tmp}/ci.pub"],
         files=KEYS, expect=("verify IMAGE", "white space")),
    Case("v49-verify-ref-short-digest", "shape", ["verify", "127.0.0.1:9/x@sha256:abc", "--key", "{tmp}/ci.pub"],
         files=KEYS, expect=("verify IMAGE", "64 lowercase hex")),
    Case("v49-verify-ref-neither-tag-nor-digest", "shape", ["verify", "127.0.0.1:9/builder/vllm", "--key",
                                                             "{tmp}/ci.pub"], files=KEYS,
         expect=("give the image by digest",)),
    Case("v49-verify-key-missing", "fs", VERIFY, expect=("--key", "No such file")),
    Case("v49-verify-key-not-pem", "shape", VERIFY, files={"ci.pub": "not a key\n"},
         expect=("--key", "is not a PEM public key")),
    Case("v49-verify-key-is-private", "shape", VERIFY, files={"ci.pub": PRIVATE},
         expect=("--key", "holds a PRIVATE key")),
    Case("v49-verify-key-rsa", "shape", VERIFY, files={"ci.pub": RSA}, expect=("--key", "RSA-2048")),
    Case("v49-verify-key-fifo", "fs", VERIFY, files={"ci.pub": fifo}, expect=("--key",)),
    Case("v49-verify-policy-not-toml", "shape", ["verify", REF, "--policy", "{tmp}/policy.toml"],
         files=policy("[[keys]\n"), expect=("--policy",)),
    Case("v49-verify-policy-no-keys", "shape", ["verify", REF, "--policy", "{tmp}/policy.toml"],
         files=policy("keys = []\n"), expect=("keys", "non-empty")),
    Case("v49-verify-policy-unknown-field", "shape", ["verify", REF, "--policy", "{tmp}/policy.toml"],
         files=policy('[[keys]]\npath = "ci.pub"\nfingerprint = "x"\n'), expect=("unknown key 'fingerprint'",)),
    Case("v49-verify-policy-expires-not-a-date", "shape", ["verify", REF, "--policy", "{tmp}/policy.toml"],
         files=policy('[[keys]]\npath = "ci.pub"\nexpires = "next year"\n'), expect=("expires", "not a date")),
    Case("v49-verify-policy-expires-a-number", "shape", ["verify", REF, "--policy", "{tmp}/policy.toml"],
         files=policy('[[keys]]\npath = "ci.pub"\nexpires = 2027\n'), expect=("expires", "a date")),
    Case("v49-verify-policy-key-missing", "fs", ["verify", REF, "--policy", "{tmp}/policy.toml"],
         files={"policy.toml": '[[keys]]\npath = "gone.pub"\n'}, expect=("keys[0]", "No such file")),
    Case("v49-verify-policy-require-unknown", "shape", ["verify", REF, "--policy", "{tmp}/policy.toml"],
         files=policy('require = ["signature"]\n[[keys]]\npath = "ci.pub"\n'), expect=("require",)),
    Case("v49-verify-lock-missing", "fs", [*VERIFY, "--lock", "{tmp}/matrix.lock"], files=KEYS,
         expect=("--lock", "no such file")),
    Case("v49-verify-lock-not-a-lock", "shape", [*VERIFY, "--lock", "{tmp}/matrix.lock"],
         files={**KEYS, "matrix.lock": "format = 7\n"}, expect=("lock format",)),
    Case("v49-verify-registry-down", "late", VERIFY, code=3, files=KEYS, expect=("could not be read",)),
    # publish's attestation flags: refused before anything is built
    Case("v49-publish-sbom-format-unknown", "shape", [*PUBLISH, "--sbom-format", "xml"], expect=("--sbom-format", "xml")),
    Case("v49-publish-cyclonedx-without-attestations", "shape", [*PUBLISH, "--sbom-format", "cyclonedx",
                                                                 "--no-attestations"],
         expect=("--sbom-format cyclonedx", "--no-attestations")),
]
