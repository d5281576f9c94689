/* builder's cuda-checkpoint: the CUDA driver's process checkpoint API (libcuda of driver >= 550) on one pid, with the
 * command line of NVIDIA's cuda-checkpoint that CRIU's CUDA plugin (plugins/cuda/cuda_plugin.c, CRIU >= 4) calls, so
 * the plugin can drive it where NVIDIA's tool is not installed:
 *   cuda-checkpoint -h                                 usage (the plugin looks for "--action" in it)
 *   cuda-checkpoint --get-state --pid PID              running | locked | checkpointed | failed
 *   cuda-checkpoint --get-restore-tid --pid PID        the thread id the restore runs on
 *   cuda-checkpoint --action lock|checkpoint|restore|unlock --pid PID [--timeout MS]
 *   cuda-checkpoint --toggle --pid PID                 running: lock + checkpoint; checkpointed: restore + unlock
 * libcuda is opened at run time (dlopen), so the tool builds with the toolkit's cuda.h alone and says in one line
 * where no driver is. Built by builder/deploy/snapshot/cuda.py: cc -O2 -o cuda-checkpoint cuda_checkpoint.c -ldl */
#include <cuda.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *USAGE =
    "usage: cuda-checkpoint [-h] (--toggle | --get-state | --get-restore-tid | --action ACTION) --pid PID "
    "[--timeout MS]\n"
    "  --action lock|checkpoint|restore|unlock\n";

static CUresult (*p_init)(unsigned int);
static CUresult (*p_error_name)(CUresult, const char **);
static CUresult (*p_lock)(int, CUcheckpointLockArgs *);
static CUresult (*p_checkpoint)(int, CUcheckpointCheckpointArgs *);
static CUresult (*p_restore)(int, CUcheckpointRestoreArgs *);
static CUresult (*p_unlock)(int, CUcheckpointUnlockArgs *);
static CUresult (*p_state)(int, CUprocessState *);
static CUresult (*p_restore_tid)(int, int *);

static int load(void) {
    void *lib = dlopen("libcuda.so.1", RTLD_NOW);
    if (lib == NULL) {
        fprintf(stderr, "no CUDA driver here (libcuda.so.1: %s)\n", dlerror());
        return 1;
    }
    struct { void **fn; const char *name; } syms[] = {
        {(void **)&p_init, "cuInit"}, {(void **)&p_error_name, "cuGetErrorName"},
        {(void **)&p_lock, "cuCheckpointProcessLock"}, {(void **)&p_checkpoint, "cuCheckpointProcessCheckpoint"},
        {(void **)&p_restore, "cuCheckpointProcessRestore"}, {(void **)&p_unlock, "cuCheckpointProcessUnlock"},
        {(void **)&p_state, "cuCheckpointProcessGetState"},
        {(void **)&p_restore_tid, "cuCheckpointProcessGetRestoreThreadId"},
    };
    for (size_t i = 0; i < sizeof(syms) / sizeof(syms[0]); i++) {
        *syms[i].fn = dlsym(lib, syms[i].name);
        if (*syms[i].fn == NULL) {
            fprintf(stderr, "the CUDA driver has no %s (a driver >= 550 has)\n", syms[i].name);
            return 1;
        }
    }
    return 0;
}

static int check(CUresult r, const char *what, int pid) {
    if (r == CUDA_SUCCESS)
        return 0;
    const char *name = NULL;
    p_error_name(r, &name);
    fprintf(stderr, "%s of pid %d failed: %s (%d)\n", what, pid, name ? name : "?", (int)r);
    return 1;
}

static int action(const char *what, int pid, unsigned int timeout_ms) {
    if (strcmp(what, "lock") == 0) {
        CUcheckpointLockArgs args;
        memset(&args, 0, sizeof(args));
        args.timeoutMs = timeout_ms;
        return check(p_lock(pid, &args), "lock", pid);
    }
    if (strcmp(what, "checkpoint") == 0)
        return check(p_checkpoint(pid, NULL), "checkpoint", pid);
    if (strcmp(what, "restore") == 0)
        return check(p_restore(pid, NULL), "restore", pid);
    if (strcmp(what, "unlock") == 0)
        return check(p_unlock(pid, NULL), "unlock", pid);
    fprintf(stderr, "--action %s: not lock, checkpoint, restore or unlock\n", what);
    return 2;
}

int main(int argc, char **argv) {
    const char *mode = NULL, *act = NULL;
    int pid = 0;
    unsigned int timeout_ms = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) {
            fputs(USAGE, stdout);
            return 0;
        } else if (strcmp(argv[i], "--toggle") == 0 || strcmp(argv[i], "--get-state") == 0 ||
                   strcmp(argv[i], "--get-restore-tid") == 0) {
            mode = argv[i];
        } else if (strcmp(argv[i], "--action") == 0 && i + 1 < argc) {
            mode = argv[i];
            act = argv[++i];
        } else if (strcmp(argv[i], "--pid") == 0 && i + 1 < argc) {
            pid = atoi(argv[++i]);
        } else if (strcmp(argv[i], "--timeout") == 0 && i + 1 < argc) {
            timeout_ms = (unsigned int)strtoul(argv[++i], NULL, 10);
        } else {
            fprintf(stderr, "%s: unknown argument\n%s", argv[i], USAGE);
            return 2;
        }
    }
    if (mode == NULL || pid <= 0) {
        fputs(USAGE, stderr);
        return 2;
    }
    if (load() || check(p_init(0), "cuInit", pid))
        return 1;
    if (strcmp(mode, "--action") == 0)
        return action(act, pid, timeout_ms);
    if (strcmp(mode, "--get-restore-tid") == 0) {
        int tid = 0;
        if (check(p_restore_tid(pid, &tid), "get-restore-tid", pid))
            return 1;
        printf("%d\n", tid);
        return 0;
    }
    CUprocessState state;
    if (check(p_state(pid, &state), "get-state", pid))
        return 1;
    if (strcmp(mode, "--get-state") == 0) {
        const char *names[] = {"running", "locked", "checkpointed", "failed"};
        printf("%s\n", (unsigned)state < 4 ? names[state] : "unknown");
        return 0;
    }
    /* --toggle, as NVIDIA's tool: a running process is locked and checkpointed, a checkpointed one restored and
     * unlocked; a kernel still running after a minute is not quiesced */
    if (state == CU_PROCESS_STATE_RUNNING)
        return action("lock", pid, timeout_ms ? timeout_ms : 60000) || action("checkpoint", pid, 0);
    if (state == CU_PROCESS_STATE_CHECKPOINTED)
        return action("restore", pid, 0) || action("unlock", pid, 0);
    fprintf(stderr, "pid %d is neither running nor checkpointed (state %d): nothing to toggle\n", pid, (int)state);
    return 1;
}
