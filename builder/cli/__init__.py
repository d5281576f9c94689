"""The `builder` command line: one module per verb, every shared flag declared once (flags.py), errors caught
once (app.py: the message and the exit code).

  app.py      the `builder` group: error handling, exit codes, signals
  flags.py    the flags more than one verb takes, each group reaching its verb as one typed value
  plan.py     plan, render, matrix          build.py   build, publish (build with a typed target)
  wheels.py   wheels ls|verify|prune|push|pull
  audit.py    audit                         lock.py    lock
  smoke.py    smoke                         serve.py   serve
  repro.py    verify-repro                  doctor.py  doctor
  rehearse.py rehearse
  bench.py    bench, bench diff, bench plot
  warm.py     warm

A verb's module is imported when the verb is asked for (app.VERB_MODULES), not at start.

Options are typed and built once (builder/options.py); the verbs call the stages below, never each other's
click commands.
"""

from .app import EXIT_CODES_HELP, BuilderCommand, main

__all__ = ["main", "BuilderCommand", "EXIT_CODES_HELP"]
