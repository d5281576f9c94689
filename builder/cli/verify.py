"""`builder verify IMAGE@digest`: the signature, SBOM and provenance of a published image, checked before it runs."""

from __future__ import annotations

from pathlib import Path

import click

from ..errors import EnvironmentProblem, Failed, UserError
from . import flags
from .app import main


@main.command("verify")
@click.argument("image")
@click.option("--key", "keys", multiple=True, type=flags.FsPath(dir_okay=False), metavar="PUB.pem",
              help="A public key (PEM: ECDSA P-256 or Ed25519) whose signatures count: the one whose private half "
                   "publish was given in BUILDER_LEDGER_SIGNING_KEY. Repeatable.")
@click.option("--policy", type=flags.FsPath(dir_okay=False), default=None, metavar="FILE",
              help="A TOML policy: [[keys]] path (relative to the file), name, expires (YYYY-MM-DD: signatures by the "
                   "key are refused after it); require = [\"provenance\", \"sbom\"].")
@click.option("--lock", "lock_path", type=flags.FsPath(dir_okay=False), default=None, metavar="matrix.lock",
              help="Check that the sources the provenance says were compiled are the commits and sdists this lock pins.")
@flags.as_json
def verify_cmd(image, keys, policy, lock_path, as_json):
    """Verify IMAGE (REPO@sha256:..., REPO:TAG@sha256:..., or REPO:TAG for what the tag names now) from its
    registry, pulling no layer: the attestations `builder publish` attached to its digest are signed by a key
    you trust, name that very digest (the SBOM its platform manifest), the provenance is of the cell and content key
    the image's labels say (and, with --lock, of the lock's sources), the SBOM lists every binary with device code
    with the SASS / PTX the labels claim, and a warm image's provenance names its cold image, warm key and layer.
    Exit 0 when every check passes, 1 with one line per failed check; bad input 2; a registry that cannot be
    read 3.

    \b
    Example:
      builder verify registry.example.com/ml/vllm@sha256:5237e09b... --key ci.pub
      builder verify registry.example.com/ml/vllm:0.33.0-cu130-torch2.14.0-py311-sm80.90 --policy deploy-policy.toml --lock matrix.lock
    """
    from ..image import verify
    from ..lockfile import Lock
    from ..registry_api import CAUSES, Unusable, first_line

    trusted = verify.load_policy(Path(policy) if policy else None, tuple(Path(k) for k in keys))
    if lock_path and not Path(lock_path).is_file():
        raise UserError(f"--lock {lock_path}: no such file")
    lock = Lock.load(Path(lock_path)) if lock_path else None
    try:
        report = verify.verify(image, trusted, lock)
    except Unusable as exc:
        raise EnvironmentProblem(f"verify {image}: its registry could not be read: {CAUSES.get(exc.cause, exc.cause)} "
                                 f"({first_line(exc)})") from None
    if as_json:
        click.echo(verify.to_json(report))
    else:
        for line in verify.lines(report):
            click.echo(line)
        if report.ok:
            click.echo(f"verified {report.digest}: " + "; ".join(report.passed[-3:]))
    if not report.ok:
        raise Failed(f"{image}: {len(report.failed)} check(s) failed")


def say_verified(image: str, given: flags.Verification, matrix_path, say) -> bool | None:
    """What serve, smoke and doctor --host say of IMAGE's attestations before they run it: True verified, False not
    (each failed check said), None not checked (no key given or named by the matrix: nothing said; a local image or
    a saved config that names no registry). With
    `given.required` anything but True is refused: exit 1 (it does not verify), exit 2 (nothing to check it with)."""
    from .. import matrix as matrix_mod
    from ..image import signing, verify
    from ..imageref import ImageRef
    from ..registry_api import CAUSES, Unusable, first_line

    keys = tuple(Path(k) for k in given.keys)
    if not keys and not given.policy and matrix_path and Path(matrix_path).is_file():
        named = matrix_mod.load(Path(matrix_path)).defaults.get(signing.MATRIX_KEY)
        keys = (Path(matrix_path).resolve().parent / named,) if named else ()
    if not keys and not given.policy:
        if given.required:
            raise UserError("--require-verified: no key to verify with (--verify-key PUB, --verify-policy FILE, or the "
                            f"matrix's [defaults] {signing.MATRIX_KEY})")
        return None  # nothing asked: a deployer who does not sign hears nothing of it
    policy = verify.load_policy(Path(given.policy) if given.policy else None, keys)
    try:
        parsed = ImageRef.parse(image, "IMAGE")
    except UserError:
        parsed = None
    if parsed is None or not parsed.registry:
        if given.required:
            raise Failed(f"--require-verified: {image} names no registry: only a published image, by its registry "
                         "digest, can be verified")
        say(f"verify: {image} not checked (a local name or file: verify reads a registry's digest)")
        return None
    try:
        report = verify.verify(image, policy)
    except Unusable as exc:
        raise EnvironmentProblem(f"verify {image}: its registry could not be read: {CAUSES.get(exc.cause, exc.cause)} "
                                 f"({first_line(exc)})") from None
    if report.ok:
        say(f"verify: {image} verified ({report.digest}: signed SBOM and provenance)")
        return True
    for line in report.failed:
        say(f"verify: FAILED {line}")
    if given.required:
        raise Failed(f"--require-verified: {image} does not verify ({len(report.failed)} check(s) failed)")
    say(f"verify: {image} does NOT verify; --require-verified refuses such an image")
    return False
