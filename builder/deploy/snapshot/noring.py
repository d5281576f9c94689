"""How a snapshot's engine is started: its own launch line, run by a few lines of Python that first turn uvloop into
asyncio. Why: CRIU cannot dump an io_uring ("Unknown shit 600 (anon_inode:[io_uring])", measured on the H100 with
vLLM 0.26.0, issue 52), and uvloop's libuv (vLLM's API server runs `uvloop.run`, SGLang's uvicorn picks uvloop)
sets one up at every event loop whatever UV_USE_IO_URING says. vLLM's EngineCore held one of its own too, where
torch's TCPStore runs on libuv (its "pt_tcpstore_uv" thread): `ENV` asks libuv for no io_uring and torch for its
store without libuv (USE_LIBUV=0, torch/distributed/rendezvous.py). The engine is otherwise untouched: the same
argv, the same modules; where uvloop is not installed nothing is changed."""

from __future__ import annotations

ENV = {"UV_USE_IO_URING": "0", "USE_LIBUV": "0"}

# python -c CODE ARGV...: ARGV is the launch line, either `python -m MODULE ...` or a console script (vllm serve ...)
CODE = """\
import asyncio, runpy, sys
try:
    import uvloop
except ImportError:
    uvloop = None
if uvloop is not None:
    uvloop.run = asyncio.run
    uvloop.new_event_loop = asyncio.new_event_loop
    uvloop.install = lambda: None
    uvloop.EventLoopPolicy = asyncio.DefaultEventLoopPolicy
argv = sys.argv[1:]
if len(argv) > 2 and argv[1] == "-m":
    sys.argv = [argv[2], *argv[3:]]
    runpy.run_module(argv[2], run_name="__main__", alter_sys=True)
else:
    from importlib.metadata import entry_points
    import os
    name = os.path.basename(argv[0])
    found = [e for e in entry_points(group="console_scripts") if e.name == name]
    if not found:
        sys.exit(f"snapshot launcher: no console script {name!r} in this environment")
    sys.argv = argv
    sys.exit(found[0].load()())
"""


def wrap(python: str, argv: tuple[str, ...]) -> tuple[str, ...]:
    """`argv` (the launch line, its interpreter first where it has one) run under the launcher above by `python`."""
    return (python, "-c", CODE, *argv)
