// cpu_table.c: the CPU backend's table of ops. Built twice (Makefile): with
// OpenMP as cpu_ops, and without OpenMP as cpu_serial_ops, whose kernels are
// the same source compiled serially (kernels/cpu/serial_names.h renames them).
#include "cpu.h"

#ifndef CPU_TABLE_NAME
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
    .matmul = cpu_matmul,
    .embedding_forward = cpu_embedding_forward,
    .embedding_backward = cpu_embedding_backward,
    .rmsnorm_forward = cpu_rmsnorm_forward,
    .rmsnorm_backward = cpu_rmsnorm_backward,
    .rope = cpu_rope,
    .attention_forward = cpu_attention_forward,
    .attention_backward = cpu_attention_backward,
    .swiglu_forward = cpu_swiglu_forward,
    .swiglu_backward = cpu_swiglu_backward,
    .ce_row_max = cpu_ce_row_max,
    .ce_partials = cpu_ce_partials,
    .ce_loss = cpu_ce_loss,
    .ce_backward = cpu_ce_backward,
    .adamw = cpu_adamw,
    .sum_squares = cpu_sum_squares,
    .scale = cpu_scale,
    .axpy = cpu_axpy,
    .add = cpu_add,
    .copy = cpu_copy,
};
