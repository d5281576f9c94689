"""An unchanged cell costs seconds: the runtime image's content key (builder/steps/image.py content_key) labels the

The Docker half of tests/unit/image/test_content_key.py: its docstring says the rest."""

from __future__ import annotations

import dataclasses
import io
import subprocess
import uuid
from pathlib import Path

from builder import pins, render
from builder.matrix import Selection, load
from builder.plan import plan_cells
from builder.resolve import select
from builder.resources import Host
from builder.steps import BuildOptions, CellContext
from builder.steps.image import content_key, runtime_call

from tests.helpers import fixture_copy


class Keyed:
    """One cell's image-step inputs, laid out as the image step lays them out, and its content key."""

    def __init__(self, tmp: Path, matrix: Path, **opts):
        (cell,) = select(load(matrix), Selection())
        self.plan = plan_cells([cell], None)[0]
        self.opts = BuildOptions(work_dir=tmp / "work", log_dir=tmp / "logs", index_url="https://pypi.org/simple",
                                 **opts)
        self.ctx = CellContext(plan=self.plan, opts=self.opts, cache=None, host=Host(2, 8.0), say=lambda _: None,
                               log=io.StringIO())
        self.ctx.context_dir.mkdir(parents=True)
        self.ctx.dockerfile.write_text(render.render(self.plan, self.opts.index_url))
        self.stage = self.ctx.dir / "wheels"
        self.stage.mkdir()
        self.wheel(b"wheel bytes")
        (self.stage / "wheels.sha256").write_text("sums\n")

    def wheel(self, data: bytes) -> None:
        import hashlib

        (w,) = self.plan.wheels
        path = self.stage / "cuda_ext-1.0.0-cp311-cp311-linux_x86_64.whl"
        path.write_bytes(data)
        self.ctx.wheels = {w.package.name: [path]}
        self.ctx.records = {w.package.name: {path.name: {"sha256": hashlib.sha256(data).hexdigest()}}}

    def key(self, audited: str = "sm_80,sm_90") -> str:
        (w,) = self.plan.wheels
        self.ctx.audits = {}
        call = runtime_call(self.ctx, self.stage, self.ctx.dir / "metadata.json")
        call = dataclasses.replace(call, build_args=tuple((k, audited if k.endswith("_SASS") else v)
                                                          for k, v in call.build_args))
        key, inputs = content_key(self.ctx, call, self.stage)
        assert key, inputs
        return key


def test_the_content_key_changes_with_every_input_and_only_then(local_bases, tmp_path):
    base = f"builder-test-ck/base:{uuid.uuid4().hex[:12]}"
    subprocess.run(["docker", "tag", local_bases["cuda_base"], base], check=True)
    try:
        m = fixture_copy(tmp_path, "127.0.0.1:5000/builder-test-ck", runtime_base=base)
        k = Keyed(tmp_path / "a", m)
        first = k.key()
        assert k.key() == first == Keyed(tmp_path / "b", m).key()  # the same inputs: the same key, every time
        changed = {}

        text = k.ctx.dockerfile.read_text()
        k.ctx.dockerfile.write_text(text.replace("RUN python -m compileall", "RUN  python -m compileall"))
        changed["a template line"] = k.key()
        k.ctx.dockerfile.write_text(text)
        assert k.key() == first

        other = Keyed(tmp_path / "c", m, source_date_epoch="1700000000")
        changed["SOURCE_DATE_EPOCH"] = other.key()
        changed["an audited label"] = k.key(audited="sm_80")
        changed["attestations"] = Keyed(tmp_path / "d", m, attest=("type=provenance,mode=max",)).key()
        gzip_layers = Keyed(tmp_path / "e", m, layer_compression="gzip")
        changed["gzip layers instead of zstd"] = gzip_layers.key()
        output = runtime_call(gzip_layers.ctx, gzip_layers.stage, gzip_layers.ctx.dir / "metadata.json").output
        assert "compression=gzip" in output and "force-compression=true" in output
        assert "compression=zstd,force-compression=true" in \
            runtime_call(k.ctx, k.stage, k.ctx.dir / "metadata.json").output  # the default

        (k.ctx.context_dir / "extra.txt").write_text("x")
        changed["a build-context file"] = k.key()
        (k.ctx.context_dir / "extra.txt").unlink()

        k.wheel(b"other wheel bytes")
        changed["a wheel"] = k.key()
        k.wheel(b"wheel bytes")
        assert k.key() == first

        req = k.stage / pins.HASHED_IN_CONTEXT
        req.write_text("packaging==24.0 --hash=sha256:" + "1" * 64 + "\n")
        changed["runtime pins"] = k.key()
        req.write_text("packaging==24.0 --hash=sha256:" + "2" * 64 + "\n")
        changed["one pin's hash"] = k.key()
        req.unlink()
        (k.stage / pins.FILE_IN_CONTEXT).write_text("packaging==24.0\n")
        changed["constraints instead of hashes"] = k.key()
        (k.stage / pins.FILE_IN_CONTEXT).unlink()
        assert k.key() == first

        # the same tag on other content: the base counts by digest, not by name
        subprocess.run(["docker", "tag", local_bases["debian"], base], check=True)
        changed["the runtime base behind the same tag"] = k.key()

        assert first not in changed.values(), {w: v for w, v in changed.items() if v == first}
        assert len(set(changed.values())) == len(changed), changed

        # a base the daemon does not hold has no digest to key it by: no key, so no reuse (the image is built)
        subprocess.run(["docker", "image", "rm", base], check=True, capture_output=True)
        call = runtime_call(k.ctx, k.stage, k.ctx.dir / "metadata.json")
        key, inputs = content_key(k.ctx, call, k.stage)
        assert key == "" and f"the base image {base} is not in the local image store" in inputs["why"]
    finally:
        subprocess.run(["docker", "image", "rm", base], capture_output=True)
