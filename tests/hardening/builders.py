"""`--builder A,B,...` (cells fanned out over several builders, builder/fanout.py) in the bad-input table: an empty
item, a builder named twice, a name that is no name, a builder or context that does not exist, and a list where one
builder is the rule (verify-repro). Each is refused in one line, exit 2, before anything is built or written."""

from __future__ import annotations

from tests.hardening.cases import DRY, PUBLISH, REPRO, Case


def _cases() -> list[Case]:
    out: list[Case] = []
    add = out.append
    for verb, base in (("build", DRY), ("publish", PUBLISH)):
        for name, value in (("empty-item", "default,,default"), ("trailing-comma", "default,"),
                            ("leading-comma", ",default"), ("only-commas", ",,"), ("blank-item", "default, ,x")):
            add(Case(f"{verb}-builders-{name}", "build", [*base, "--builder", value], expect=("--builder", "empty item")))
        add(Case(f"{verb}-builders-twice", "build", [*base, "--builder", "default,x,default"],
                 expect=("--builder", "default named twice")))
        add(Case(f"{verb}-builders-bad-name", "build", [*base, "--builder", "default,a b"],
                 expect=("--builder", "not a builder name")))
        add(Case(f"{verb}-builders-newline", "build", [*base, "--builder", "default,a\nb"], expect=("--builder",)))
        # which builders exist only the docker CLI knows: it is asked (its context and buildx stores, no daemon: the
        # socket named here does not exist), so this case is not one of those refused before any program runs
        add(Case(f"{verb}-builders-unknown", "build", [*base, "--builder", "default,no-such-builder-xq"],
                 env={"DOCKER_HOST": "unix:///nonexistent/builder-hardening.sock"},
                 expect=("--builder no-such-builder-xq", "neither a docker context nor a buildx builder"),
                 needs_programs=True))
    add(Case("repro-builders-a-list", "repro", [*REPRO, "--builder", "a,b"], expect=("--builder", "one builder")))
    return out


CASES: list[Case] = _cases()
