// cmd_ckpt.c: `trident ckpt info DIR` and `trident ckpt verify DIR`. DIR is a
// checkpoint folder (step-NNNNNN) or a [checkpoint] dir holding `latest`.
// Both validate the whole checkpoint (checkpoint_open) and exit 2 on a bad one.
#include <string.h>

#include "checkpoint.h"
#include "cli.h"

static void print_info(const struct ckpt_reader *r) {
    const struct ckpt_info *in = checkpoint_info(r);
    const struct llama_config *m = &in->model;
    printf("checkpoint %s\n", in->path);
    printf("  format_version %d, step %lld\n", in->format_version, (long long)in->step);
    printf("  layout tp=%d pp=%d dp=%d (world %d), zero_stage=%d\n", in->tp, in->pp, in->dp,
           in->world_size, in->zero_stage);
    printf("  model vocab_size=%d d_model=%d n_layers=%d n_heads=%d n_kv_heads=%d ffn_dim=%d "
           "tie_embeddings=%d\n", m->vocab_size, m->d_model, m->n_layers, m->n_heads,
           m->n_kv_heads, m->ffn_dim, m->tie_embeddings ? 1 : 0);
    printf("  tokenizer %s\n", in->tokenizer_id[0] ? in->tokenizer_id : "(none)");
    printf("  %-60s %-12s %-5s %6s %12s\n", "tensor", "shape", "dtype", "pieces", "bytes");
    int n = checkpoint_n_pieces(r);
    size_t total = 0;
    for (int i = 0, j; i < n; i = j) {
        const struct ckpt_piece *p = checkpoint_piece_at(r, i, NULL);
        size_t bytes = 0;
        for (j = i; j < n; j++) {
            const struct ckpt_piece *q = checkpoint_piece_at(r, j, NULL);
            if (strcmp(q->name, p->name)) break;
            bytes += (q->flat_end - q->flat_begin) * dtype_size(q->dtype);
        }
        char shape[32];
        snprintf(shape, sizeof shape, "(%d, %d)", p->grows, p->gcols);
        printf("  %-60s %-12s %-5s %6d %12zu\n", p->name, shape, dtype_name(p->dtype), j - i,
               bytes);
        total += bytes;
    }
    printf("  total stored %.3f MB in %d pieces\n", total / 1e6, n);
}

int cmd_ckpt(int argc, char **argv) {
    if (argc != 3 || (strcmp(argv[1], "info") && strcmp(argv[1], "verify"))) {
        fprintf(stderr, "usage: trident ckpt info DIR | trident ckpt verify DIR\n"
                        "  DIR: a checkpoint folder (step-NNNNNN) or a folder holding 'latest'\n");
        return STATUS_BAD_INPUT;
    }
    struct error err = {0};
    struct ckpt_reader *r;
    if (checkpoint_open(argv[2], &r, &err)) {
        fprintf(stderr, "trident: ckpt %s: %s\n", argv[1], err.msg);
        return err.status;
    }
    if (!strcmp(argv[1], "info")) {
        print_info(r);
    } else {
        const struct ckpt_info *in = checkpoint_info(r);
        printf("ok: %s: step %lld, %d rank files, %d pieces; checksums match, every tensor "
               "complete\n", in->path, (long long)in->step, in->world_size,
               checkpoint_n_pieces(r));
    }
    checkpoint_close(r);
    return STATUS_OK;
}
