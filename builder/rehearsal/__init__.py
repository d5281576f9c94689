"""The programs `builder rehearse` runs inside containers of a cell's build stage (builder/rehearse.py). builder
never imports them: rehearse.py mounts this directory read-only into each container (at
/rehearsal-programs, as smoke mounts deploy/smoke/probe.py) and runs them with the stage's own python3.

- capture_site.py  the sitecustomize.py of the capture run: the first `ninja` or `cmake --build` a Python build
                   backend starts is stopped, and the compile commands of its build.ninja written instead
- nvcc.py          the recording nvcc a setup.py that runs nvcc itself meets (through CUDA_HOME)
- measure.py       runs one compile command, sampling the resident memory of every process of its container

They use the standard library only (whatever Python the stage has) and talk to builder through files in the
writable rehearsal directory ($REHEARSAL_OUT, and the paths given on their command line).
"""
