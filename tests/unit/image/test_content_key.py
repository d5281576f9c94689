"""An unchanged cell costs seconds: the runtime image's content key (builder/steps/image.py content_key) labels the
image, and a later build whose key is the same reuses the tagged image with no build and no OCI export. A wrong
reuse is worse than a slow build, so the key is held to change with every input of the runtime build, on the
fixture cell: the rendered Dockerfile, a build argument, the attestations, the layers' compression, the base image
behind an unchanged tag, a file of the build context, a wheel, the runtime pins. The daemon is real (the bases'
digests come from it)."""

from __future__ import annotations

from builder import pins


def test_the_pins_header_names_the_image_until_a_pin_line_changes():
    body = "a==1 --hash=sha256:" + "0" * 64 + "\nb[x]==2 --hash=sha256:" + "1" * 64 + "\n"
    digest, key = "sha256:" + "a" * 64, "b" * 64
    text = "# Written by `builder build` ...\n" + pins.origin_line(digest, key, pins.lines_digest(body)) + body
    assert pins.origin(text) == (digest, key)
    assert pins.origin(text + "# a comment\n\n") == (digest, key)  # comments do not reach pip
    assert pins.origin(text.replace("a==1", "a==1.0")) is None
    assert pins.origin(text + "c==3\n") is None
    assert pins.origin(body) is None
