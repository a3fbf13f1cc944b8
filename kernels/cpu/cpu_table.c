// cpu_table.c: the CPU backend's table of ops. Built twice (Makefile): with
// OpenMP as cpu_ops, and without OpenMP (CPU_SERIAL) as cpu_serial_ops, whose
// entries are the same source compiled serially, linked as cpu_serial_<op>
// (kernels/cpu/cpu.h).
#include "cpu.h"

#ifdef CPU_SERIAL
#define CPU_TABLE_NAME cpu_serial_ops
#else
#define CPU_TABLE_NAME cpu_ops
#endif

const struct backend_ops CPU_TABLE_NAME = {
    .name = "cpu",
    .destroy = cpu_destroy,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .to_device = cpu_memcpy,
    .to_host = cpu_memcpy,
    .memset0 = cpu_memset0,
    .synchronize = cpu_synchronize,
    .host_memory = true,
    .matmul_invariant = cpu_matmul_invariant,
#define CPU_TABLE_ENTRY(name, ret, params) .name = cpu_##name,
    BACKEND_OPS(CPU_TABLE_ENTRY)
#undef CPU_TABLE_ENTRY
};
