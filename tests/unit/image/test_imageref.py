"""Image references parsed once (builder/imageref.py): the forms builder meets, Docker's normalisation of a name
without a registry, and the forms the grammar refuses, each in one line naming the part."""

from __future__ import annotations

import pytest

from builder.errors import UserError
from builder.imageref import ImageRef

D = "sha256:" + "ab" * 32


@pytest.mark.pure
@pytest.mark.parametrize("text, written_host, repository, tag, digest, api_host, api_repository", [
    (f"127.0.0.1:5000/builder/vllm@{D}", "127.0.0.1:5000", "builder/vllm", "", D, "127.0.0.1:5000", "builder/vllm"),
    ("127.0.0.1:5000/builder/vllm:0.33.0-cu130", "127.0.0.1:5000", "builder/vllm", "0.33.0-cu130", "", "127.0.0.1:5000",
     "builder/vllm"),
    (f"127.0.0.1:5000/builder/vllm:0.33.0@{D}", "127.0.0.1:5000", "builder/vllm", "0.33.0", D, "127.0.0.1:5000",
     "builder/vllm"),
    ("library/x", "", "library/x", "", "", "registry-1.docker.io", "library/x"),
    ("x:1", "", "x", "1", "", "registry-1.docker.io", "library/x"),
    ("nvidia/cuda:13.0.3-base-ubuntu24.04", "", "nvidia/cuda", "13.0.3-base-ubuntu24.04", "", "registry-1.docker.io",
     "nvidia/cuda"),
    ("docker.io/x", "docker.io", "x", "", "", "registry-1.docker.io", "library/x"),
    ("localhost/a/b_c__d-e.f", "localhost", "a/b_c__d-e.f", "", "", "localhost", "a/b_c__d-e.f"),
    ("Registry/x", "Registry", "x", "", "", "Registry", "x"),
    ("ghcr.io/o/p:v", "ghcr.io", "o/p", "v", "", "ghcr.io", "o/p"),
    ("[::1]:5000/x:y", "[::1]:5000", "x", "y", "", "[::1]:5000", "x"),
    ("builder-local/cuda:13.0-base", "", "builder-local/cuda", "13.0-base", "", "registry-1.docker.io",
     "builder-local/cuda"),
])
def test_the_forms_builder_meets_parse_into_one_value(text, written_host, repository, tag, digest, api_host,
                                                      api_repository):
    ref = ImageRef.parse(text)
    assert (ref.registry, ref.repository, ref.tag, ref.digest) == (written_host, repository, tag, digest)
    assert (ref.api_host, ref.api_repository) == (api_host, api_repository)
    assert str(ref) == text  # as the user wrote it
    assert ref.reference == (digest or tag or "latest")


@pytest.mark.pure
def test_derived_references():
    ref = ImageRef.parse("127.0.0.1:5000/builder/vllm:t")
    assert str(ref.with_digest(D)) == f"127.0.0.1:5000/builder/vllm@{D}"
    assert ref.name == "127.0.0.1:5000/builder/vllm" and ref.host == "127.0.0.1:5000"
    assert ImageRef.parse("x").host == "docker.io"
    assert ImageRef.parse("x").same_repository(ImageRef.parse("docker.io/library/x:2"))
    assert not ImageRef.parse("a/x").same_repository(ImageRef.parse("b/x"))
    # no slash: a name and a tag on Docker Hub, as Docker reads it, not a registry
    assert ImageRef.parse("127.0.0.1:5000") == ImageRef("", "127.0.0.1", "5000", "")


@pytest.mark.pure
@pytest.mark.parametrize("text, words", [
    ("", "empty"),
    (" x", "white space"),
    ("x\n", "white space"),
    ("X", "is not a repository path"),
    ("a/UP:1", "is not a repository path"),
    ("x@sha256:abc", "64 lowercase hex"),
    ("x@sha256:" + "AB" * 32, "64 lowercase hex"),
    ("x@md5", "is not a digest"),
    ("x@", "is not a digest"),
    ("x:", "is not a tag"),
    ("x:-bad", "is not a tag"),
    ("x:" + "t" * 129, "is not a tag"),
    ("x:a:b", "is not a repository path"),
    ("host:port/x", "is not a registry host"),
    ("127.0.0.1:5000/", "is not a repository path"),
    ("a//b", "is not a repository path"),
    ("a/b/", "is not a repository path"),
    ("-a/b", "is not a repository path"),
    ("a..b", "is not a repository path"),
    ("a___b", "is not a repository path"),
    ("exa_mple.com/x", "is not a registry host"),
    ("a/" + "b" * 300, "longer than 255"),
    ("127.0.0.1:9/x?token=abc", "holds '=' '?', which no image reference has"),
    ("x#frag", "holds '#'"),
])
def test_the_forms_the_grammar_refuses_are_one_line_naming_the_part(text, words):
    with pytest.raises(UserError) as info:
        ImageRef.parse(text, "--image")
    message = str(info.value)
    assert message.startswith("--image: ") and words in message and "\n" not in message, message
