"""sitecustomize.py of the capture run (copied under that name onto the container's PYTHONPATH): the first `ninja`
or `cmake --build` a Python build backend starts is stopped; the commands of its build.ninja (`ninja -t compdb`)
are written to $REHEARSAL_OUT/compdb-N.json instead, and the process exits 86: nothing was compiled."""

import json
import os
import subprocess

CAPTURED = "rehearsal-captured"  # printed once the build tool's commands are written

_real_init = subprocess.Popen.__init__


def _stop_at_build_tool(self, args, *a, **kw):
    argv = [str(x) for x in args] if isinstance(args, (list, tuple)) else None
    cwd = str(kw.get("cwd") or os.getcwd())
    where = None
    if argv and os.path.basename(argv[0]) == "ninja" and "-t" not in argv:
        where = argv[argv.index("-C") + 1] if "-C" in argv else cwd
    elif argv and os.path.basename(argv[0]) == "cmake" and len(argv) > 2 and argv[1] == "--build":
        where = argv[2]
    if where is None:
        return _real_init(self, args, *a, **kw)
    where = os.path.join(cwd, where)
    compdb = subprocess.run(["ninja", "-C", where, "-t", "compdb"], capture_output=True, text=True, check=True)
    out = os.environ["REHEARSAL_OUT"]
    n = len([f for f in os.listdir(out) if f.startswith("compdb-")])
    with open(os.path.join(out, f"compdb-{n}.json"), "w") as f:
        json.dump({"build_dir": where, "entries": json.loads(compdb.stdout)}, f)
    print(CAPTURED, flush=True)
    os._exit(86)


subprocess.Popen.__init__ = _stop_at_build_tool
