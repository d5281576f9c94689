"""The one reading of --strategy: names of the engine data (matched without regard to case), checked against the
engine version and what the image was built for (`check_strategy`). smoke runs the names it is given (`all`: every
strategy of the data; the engine data refuses, per layer, one the version cannot run); bench adds `none`, no
speculation, the baseline of its comparison (`all`: none + every strategy the image was built for); serve and warm
start one."""

from __future__ import annotations

from ..errors import UserError
from ..image import labels as labels_mod
from ..schema import did_you_mean

NONE = "none"  # bench's row without speculation


def known(kn=None) -> tuple[str, ...]:
    """The strategy names of the engine data (a matrix's knowledge, else the built-in data)."""
    from ..engines import load_knowledge

    return (kn or load_knowledge()).strategy_names()


def split(value: str) -> tuple[str, ...]:
    return tuple(v.strip() for v in value.split(",") if v.strip())


def one(value: str, names: tuple[str, ...] | None = None, or_all: bool = False) -> str:
    """One strategy name of the engine data, matched without regard to case."""
    names = names or known()
    match = next((s for s in names if s.lower() == value.strip().lower()), None)
    if match is None:
        raise UserError(f"--strategy: {value!r} is not a strategy{did_you_mean(value, names)}; "
                        f"known: {', '.join(names)}" + (", or all" if or_all else ""))
    return match


def for_smoke(value: str | None, default: tuple[str, ...], names: tuple[str, ...] | None = None) -> tuple[str, ...]:
    """What smoke proves: the named strategies, `all` of the data's, or (None) the cell's own."""
    names = names or known()
    if value is None:
        return default
    if not split(value):  # `--strategy ,` would drop every strategy: L2 and L3 would prove nothing
        raise UserError(f"--strategy {value!r}: no strategy named; give {','.join(names)} or all")
    if value.strip().lower() == "all":
        return names
    return tuple(dict.fromkeys(one(v, names, or_all=True) for v in split(value)))


def bench_names(value: str, names: tuple[str, ...] | None = None) -> tuple[str, ...] | None:
    """--strategy's names for bench, none among them first; None for `all`. Checked against the engine data
    before any image is looked at; what the image was built for comes later (`for_bench`)."""
    names = names or known()
    if value.strip().lower() == "all":
        return None
    given = split(value)
    if not given:
        raise UserError(f"--strategy {value!r}: no strategy named; give {NONE}, {','.join(names)} or all")
    got = [one(n, (NONE, *names), or_all=True) for n in given]
    return tuple(dict.fromkeys([NONE] * (NONE in got) + [n for n in got if n != NONE]))


def check_strategy(recipe, strategy: str, built_for: list[str] | tuple[str, ...], subject: str) -> None:
    """Refuses a strategy the engine version cannot run, or one the image was not built and smoke-tested for
    (its io.builder.strategies label, `built_for`): what `builder serve`, `builder bench` and `builder warm` may
    start."""
    why = recipe.strategy_problem(strategy)
    if why:
        raise UserError(f"--strategy {strategy}: {why}")
    if strategy not in built_for:
        raise UserError(f"--strategy {strategy}: {subject} was built and smoke-tested for "
                        f"{', '.join(built_for) or 'no strategy'} (label {labels_mod.STRATEGIES})")


def for_bench(value: str, built_for: tuple[str, ...], recipe, subject: str,
              names: tuple[str, ...] | None = None) -> tuple[str, ...]:
    """none + the named strategies; `all` is none + every strategy the image was built for. A strategy the
    engine version cannot run, or the image was not built and smoke-tested for, is refused."""
    chosen = bench_names(value, names)
    if chosen is None:
        return (NONE, *built_for)
    for s in chosen:
        if s != NONE:
            check_strategy(recipe, s, built_for, subject)
    return chosen
