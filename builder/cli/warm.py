"""`builder warm IMAGE --strategy S`: a first boot that is a warm boot. Boot the image on this host with its cache root
empty, run smoke L3's requests (the shapes the engine compiles at its first requests), stop it, and build the warm
image: the image plus one layer holding exactly what the boot wrote under the root (builder/deploy/warm/layer.py), labelled
with what it was warmed for and the cold and warm boot seconds (it is booted once more from the warm layer, which
must compile nothing beyond the engine data's warm_allowance). `--from-dir` packs a capture made elsewhere. The
pipeline is builder/deploy/warm/capture.py: this verb reads its flags into a Request and prints the result."""

from __future__ import annotations

import json
from pathlib import Path

import click

from . import flags
from .app import main


@main.command("warm")
@click.argument("target")
@click.option("--strategy", required=True, help="The strategy to warm the image for (e.g. MTP2): one per warm image.")
@flags.matrix
@flags.run_flags
@flags.cache_root(", so the captured paths are the image's paths; it must be empty.")
@flags.image_paths
@click.option("--resume", is_flag=True,
              help="With --launcher process: the cache root holds what a cold boot of this capture left when it was cut "
                   "(its boot timeout, recorded in the capture's cut.json): boot again from there and capture the whole "
                   "root; the cold seconds are the cut boot's and this one's.")
@click.option("--from-dir", "from_dir", default=None, type=flags.FsPath(file_okay=False),
              help="Pack a capture made elsewhere (DIR/tree/ and DIR/warm.json, as this verb writes them): no boot.")
@click.option("--out", "out_dir", default="warm", show_default=True, type=flags.FsPath(file_okay=False),
              help="Captures go to DIR/<warm tag>/ (tree/, warm.json, the engine logs).")
@click.option("--push", "registry", default=None, metavar="REGISTRY",
              help="Push the warm image by digest to REGISTRY (HOST[:PORT]/PATH, as publish's --registry: the publish "
                   "code path) beside its cold image, which REGISTRY must already serve (`builder publish`); it is "
                   "listed in images.json's `warm` table.")
@click.option("--images-json", default="images.json", show_default=True, type=flags.FsPath(dir_okay=False),
              help="With --push: the images.json to list it in.")
@flags.as_json
def warm(target, strategy, matrix_path, run, cache_root, image_paths, resume, from_dir, out_dir, registry, images_json,
         as_json):
    """Build the warm image of TARGET (an image) for STRATEGY on this host's GPU: its first boot then compiles nothing.
    On a GPU host without Docker, TARGET is a cell id of --matrix and --launcher process --image-paths captures only
    (cold boot, capture, a warm boot from it in place); pack the capture where the image is with --from-dir.

    \b
    Example:
      builder warm 127.0.0.1:5000/builder/vllm:0.26.0-cu130-torch2.11.0-py312-sm90 --strategy MTP2 --model tiny
      builder warm vllm-0.26.0-cu130-torch2.11.0-py312-sm90 --matrix M --launcher process --python /opt/venv/bin/python \\
          --image-paths --strategy MTP2                      # a GPU host without Docker: the capture only
      builder warm IMAGE --strategy MTP2 --from-dir warm/<tag>   # packs a capture from another host
    """
    from .. import files
    from ..deploy import strategies
    from ..deploy.warm import capture
    from ..errors import UserError

    flags.process_only(run, cache_root=cache_root is not None, image_paths=image_paths, resume=resume)
    if from_dir is not None and not from_dir.strip():  # not a boot without a word
        raise UserError("--from-dir: empty; name the capture directory to pack")
    if registry is not None and not registry.strip():  # not a warm image left unpushed without a word
        raise UserError("--push: empty; name the registry (HOST[:PORT]/PATH), or leave the flag out")
    if registry is None and flags.given(click.get_current_context(), "images_json"):  # not a list never written
        raise UserError("--images-json: the images.json --push lists the warm image in; without --push nothing is "
                        "listed (give --push REGISTRY, or leave --images-json out)")
    if from_dir is None:  # where the capture goes, before any boot (a file in its way, read-only)
        if not out_dir.strip():
            raise UserError("--out: empty; name the directory the captures go to")
        files.writable_dir(Path(out_dir), "--out")
    m = flags.given_matrix(matrix_path)
    strategy = strategies.one(strategy, m.knowledge.strategy_names() if m is not None else strategies.known())
    request = capture.Request(target=target, strategy=strategy, run=run, matrix=m,
                              matrix_path=matrix_path, cache_root=cache_root, image_paths=image_paths, resume=resume,
                              from_dir=Path(from_dir) if from_dir is not None else None, out_dir=Path(out_dir),
                              registry=registry, images_json=Path(images_json))
    result = capture.run(request, lambda s: click.echo(s, err=True))
    click.echo(json.dumps(result.to_json(), indent=2) if as_json else result.text())
