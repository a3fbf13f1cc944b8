// serial_names.h: force-included (-include) when kernels/cpu/*.c are built a
// second time without OpenMP (Makefile, CPU_SERIAL_*): the op functions get
// the prefix cpu_serial_ so both builds link into one program, and the table
// of cpu_table.c becomes cpu_serial_ops. With one thread the backend uses this
// build: libgomp allocates (memalign) a team for every parallel region of a
// single thread, and the training step must allocate nothing.
#ifndef TRIDENT_CPU_SERIAL_NAMES_H
#define TRIDENT_CPU_SERIAL_NAMES_H
#define CPU_TABLE_NAME cpu_serial_ops
#define cpu_adamw cpu_serial_adamw
#define cpu_add cpu_serial_add
#define cpu_attention_backward cpu_serial_attention_backward
#define cpu_attention_forward cpu_serial_attention_forward
#define cpu_axpy cpu_serial_axpy
#define cpu_ce_backward cpu_serial_ce_backward
#define cpu_ce_loss cpu_serial_ce_loss
#define cpu_ce_partials cpu_serial_ce_partials
#define cpu_ce_row_max cpu_serial_ce_row_max
#define cpu_copy cpu_serial_copy
#define cpu_embedding_backward cpu_serial_embedding_backward
#define cpu_embedding_forward cpu_serial_embedding_forward
#define cpu_matmul cpu_serial_matmul
#define cpu_rmsnorm_backward cpu_serial_rmsnorm_backward
#define cpu_rmsnorm_forward cpu_serial_rmsnorm_forward
#define cpu_rope cpu_serial_rope
#define cpu_scale cpu_serial_scale
#define cpu_sum_squares cpu_serial_sum_squares
#define cpu_swiglu_backward cpu_serial_swiglu_backward
#define cpu_swiglu_forward cpu_serial_swiglu_forward
#endif
