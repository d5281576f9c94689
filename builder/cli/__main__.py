"""`python -m builder.cli`: the same entry point as the `builder` console script."""

from . import main

main()
