// nvtx_record.c: a test NVTX tool (tests/e2e/nvtx_ranges.sh). NVTX (the
// CUDA toolkit's nvtx3, src/base/nvtx.c) loads the shared library named by
// NVTX_INJECTION64_PATH on a process's first NVTX call and calls its
// InitializeInjectionNvtx2 (nvtx3/nvtxDetail/nvtxInit.h), which fills in the
// core module's function table (nvtxTypes.h: NVTX_CB_MODULE_CORE,
// NVTX_CBID_CORE_*) as Nsight Systems' own injection does. This one records
// every range push and pop to TRIDENT_NVTX_RECORD/nvtx-<pid>.txt, one line
// each, written with one write(2) on an O_APPEND descriptor:
//     <thread id> push <name>
//     <thread id> pop
// Build: cc -shared -fPIC -I$CUDA_HOME/include nvtx_record.c -o libnvtx_record.so
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <nvtx3/nvToolsExt.h>

static int record_fd = -1;
static __thread int depth; // this thread's open ranges, NVTX's return value

static void record(const char *what, const char *name) {
    if (record_fd < 0) return;
    char line[512];
    int n = snprintf(line, sizeof line, "%ld %s%s%s\n", (long)syscall(SYS_gettid), what, name ? " " : "",
                     name ? name : "");
    if (n > (int)sizeof line - 1) n = sizeof line - 1, line[n - 1] = '\n';
    if (write(record_fd, line, (size_t)n) != n) perror("nvtx_record: write");
}

static int push_a(const char *name) {
    record("push", name);
    return depth++;
}

static int push_ex(const nvtxEventAttributes_t *a) {
    record("push", a && a->messageType == NVTX_MESSAGE_TYPE_ASCII ? a->message.ascii : "(not ascii)");
    return depth++;
}

static int pop(void) {
    record("pop", NULL);
    return depth > 0 ? --depth : -1;
}

__attribute__((visibility("default"))) int InitializeInjectionNvtx2(NvtxGetExportTableFunc_t get_table) {
    const char *dir = getenv("TRIDENT_NVTX_RECORD");
    if (!dir) return 0;
    char path[4096];
    snprintf(path, sizeof path, "%s/nvtx-%d.txt", dir, (int)getpid());
    record_fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (record_fd < 0) {
        perror(path);
        return 0;
    }
    const NvtxExportTableCallbacks *cb = get_table(NVTX_ETID_CALLBACKS);
    NvtxFunctionTable table = NULL;
    unsigned int size = 0;
    if (!cb || !cb->GetModuleFunctionTable(NVTX_CB_MODULE_CORE, &table, &size) || !table ||
        size <= NVTX_CBID_CORE_RangePop)
        return 0;
    *table[NVTX_CBID_CORE_RangePushA] = (NvtxFunctionPointer)push_a;
    *table[NVTX_CBID_CORE_RangePushEx] = (NvtxFunctionPointer)push_ex;
    *table[NVTX_CBID_CORE_RangePop] = (NvtxFunctionPointer)pop;
    record("init", NULL);
    return 1;
}
