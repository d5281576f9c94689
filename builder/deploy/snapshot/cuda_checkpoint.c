/* builder's CUDA checkpoint tool: the CUDA driver's process checkpoint API (libcuda of driver >= 550) on one pid.
 *   cuda_checkpoint checkpoint PID   lock the process's CUDA work, then copy its GPU memory to host memory
 *   cuda_checkpoint restore PID      copy it back to the GPU, then unlock the process
 *   cuda_checkpoint state PID        running | locked | checkpointed | failed
 * Built by builder/deploy/snapshot/cuda.py with the toolkit's cuda.h: cc -O2 -o T cuda_checkpoint.c -lcuda */
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int check(CUresult r, const char *what, int pid) {
    if (r == CUDA_SUCCESS)
        return 0;
    const char *name = NULL;
    cuGetErrorName(r, &name);
    fprintf(stderr, "%s of pid %d failed: %s (%d)\n", what, pid, name ? name : "?", (int)r);
    return 1;
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: %s checkpoint|restore|state PID\n", argv[0]);
        return 2;
    }
    int pid = atoi(argv[2]);
    if (pid <= 0) {
        fprintf(stderr, "%s: not a pid\n", argv[2]);
        return 2;
    }
    if (check(cuInit(0), "cuInit", pid))
        return 1;
    if (strcmp(argv[1], "checkpoint") == 0) {
        CUcheckpointLockArgs lock;
        memset(&lock, 0, sizeof(lock));
        lock.timeoutMs = 60000; /* a kernel still running after a minute is not quiesced */
        return check(cuCheckpointProcessLock(pid, &lock), "lock", pid) ||
               check(cuCheckpointProcessCheckpoint(pid, NULL), "checkpoint", pid);
    }
    if (strcmp(argv[1], "restore") == 0)
        return check(cuCheckpointProcessRestore(pid, NULL), "restore", pid) ||
               check(cuCheckpointProcessUnlock(pid, NULL), "unlock", pid);
    if (strcmp(argv[1], "state") == 0) {
        CUprocessState state;
        if (check(cuCheckpointProcessGetState(pid, &state), "state", pid))
            return 1;
        const char *names[] = {"running", "locked", "checkpointed", "failed"};
        printf("%s\n", (unsigned)state < 4 ? names[state] : "unknown");
        return 0;
    }
    fprintf(stderr, "%s: not checkpoint, restore or state\n", argv[1]);
    return 2;
}
