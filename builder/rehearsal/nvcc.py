#!/usr/bin/env python3
"""The recording nvcc (copied as $CUDA_HOME/bin/nvcc of the capture run): a call with an output (-o) is written
down to $REHEARSAL_OUT/nvcc.jsonl and its output left empty; any other call (`nvcc --version`, what torch and
CMake ask) goes to the real nvcc ($REHEARSAL_REAL_NVCC)."""

import json
import os
import sys

argv = sys.argv[1:]
if "-o" not in argv:
    os.execv(os.environ["REHEARSAL_REAL_NVCC"], ["nvcc", *argv])
with open(os.path.join(os.environ["REHEARSAL_OUT"], "nvcc.jsonl"), "a") as f:
    f.write(json.dumps({"cwd": os.getcwd(), "argv": [sys.argv[0], *argv]}) + "\n")
out = os.path.join(os.getcwd(), argv[argv.index("-o") + 1])
os.makedirs(os.path.dirname(out), exist_ok=True)
open(out, "wb").close()
