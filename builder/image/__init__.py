"""The image: the noun the build and the deployer share, in one room.

- labels.py, launchline.py: its contract, what an image says of itself (labels) and how it is started (the
  ENTRYPOINT and the launch line of every strategy). render writes it; deploy/ reads it, and only it.
- ledger.py: its record, the digests builder built (and published) for each content key.
- signing.py: the ledger record's DSSE signature, made by publish and verified by reuse.
- reuse.py: the one decision "reuse this image (digest, who vouches) or build (why)", for an image of the local
  daemon and one of a registry alike, and the ledger record a registry keeps beside the image.
- oci.py, publish.py: its archive and its publication (push by digest, aliases, images.json).
- sizes.py: where its bytes go, read from its archive (per layer, kind, distribution, duplicate, arch); its walk is
  the one pass over the layers.
- sbom.py: what it holds, read from its archive: an SPDX 2.3 SBOM (Debian packages, dist-infos, the wheels builder
  compiled with their archs, each binary's device code, the caches under its cache root) and its coverage check.
- provenance.py, attest.py, verify.py: what a deployer checks by digest: the SLSA provenance of its build, both
  statements signed (DSSE in a Sigstore bundle) and attached to its digest as OCI 1.1 referrers, and `builder
  verify`'s checks of them against the image, its labels and a lock.

It imports neither the build's runner and steps, the verbs, nor deploy/ (tests/unit/project/test_layers.py).
"""
