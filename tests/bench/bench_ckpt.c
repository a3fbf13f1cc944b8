// bench_ckpt.c: checkpoint save and load bandwidth for a 124M-parameter
// model (GPT-2 small sizes in LLaMA shapes: embedding (50304, 768), 12 blocks
// of q/k/v/o (768, 768), gate/up (2048, 768), down (768, 2048), two norm
// gains) in fp32 with AdamW moments m and v: about 1.5 GB on one rank.
// Against `dd ... bs=1M count=1024 conv=fsync` in the same folder. Save is
// checkpoint_save (HDF5 write, fsync, checksum, manifest, renames); load is
// checkpoint_open (checksums of every byte, tags, coverage) plus
// checkpoint_read_piece of every tensor whole. Then the same save
// asynchronously (checkpoint_save_begin/finish): the training stall against
// the synchronous save's time (issue 27's goal: at most 10%). No timing assertions.
// Usage: build/bench/bench_ckpt [DIR]   (default /tmp)
#include <string.h>
#include <unistd.h>

#include "ckpt/checkpoint.h"

enum { C = 768, F = 2048, L = 12, V = 50304 };

int main(int argc, char **argv) {
    char dir[512], cmd[1200];
    snprintf(dir, sizeof dir, "%s/trident_bench_ckpt_%d", argc > 1 ? argv[1] : "/tmp",
             (int)getpid());
    struct { const char *name; int rows, cols; } shapes[] = {
        {"q_proj", C, C}, {"k_proj", C, C}, {"v_proj", C, C}, {"o_proj", C, C},
        {"gate_proj", F, C}, {"up_proj", F, C}, {"down_proj", C, F},
        {"input_layernorm", C, 1}, {"post_attention_layernorm", C, 1}};
    int per_layer = sizeof shapes / sizeof shapes[0];
    int n_tensors = 2 + L * per_layer; // + embedding, final norm
    struct ckpt_piece *p = xcalloc((size_t)3 * n_tensors, sizeof *p);
    size_t total = 0;
    for (int i = 0; i < n_tensors; i++) {
        char hf[96];
        int rows, cols;
        if (i == 0) snprintf(hf, sizeof hf, "model.embed_tokens.weight"), rows = V, cols = C;
        else if (i == 1) snprintf(hf, sizeof hf, "model.norm.weight"), rows = C, cols = 1;
        else {
            int l = (i - 2) / per_layer, k = (i - 2) % per_layer;
            snprintf(hf, sizeof hf, "model.layers.%d.%s.weight", l, shapes[k].name);
            rows = shapes[k].rows, cols = shapes[k].cols;
        }
        for (int s = 0; s < 3; s++) {
            struct ckpt_piece *q = &p[3 * i + s];
            snprintf(q->name, sizeof q->name, "%s/%s", s == 0 ? "param" : s == 1 ? "adam_m" : "adam_v", hf);
            q->grows = q->rows = rows, q->gcols = q->cols = cols;
            q->flat_end = (size_t)rows * cols;
            q->dtype = DTYPE_FP32;
            float *d = xmalloc(q->flat_end * sizeof *d);
            for (size_t e = 0; e < q->flat_end; e++) d[e] = (float)((e * 2654435761u) % 1000) * 1e-3f;
            q->data = d;
            if (s == 0) total += q->flat_end;
        }
    }
    double gb = 3.0 * total * 4 / 1e9;
    printf("bench_ckpt: %.1fM parameters, %d tensors, %.2f GB with m and v, in %s\n",
           total / 1e6, n_tensors, gb, dir);

    snprintf(cmd, sizeof cmd, "mkdir -p %s && sync", dir);
    if (system(cmd)) return 1;
    snprintf(cmd, sizeof cmd, "dd if=/dev/zero of=%s/x bs=1M count=1024 conv=fsync status=none", dir);
    double t0 = time_now_s();
    if (system(cmd)) return 1;
    double dd_s = time_now_s() - t0;
    snprintf(cmd, sizeof cmd, "rm -f %s/x", dir);
    if (system(cmd)) return 1;
    printf("  dd 1 GiB conv=fsync          %6.2f s  %6.2f GB/s\n", dd_s, 1.073741824 / dd_s);

    struct comm_group self;
    comm_self_init(&self);
    struct llama_config m = {.vocab_size = V, .d_model = C, .n_layers = L, .n_heads = 12,
                             .n_kv_heads = 12, .ffn_dim = F, .max_seq_len = 1024,
                             .rope_theta = 10000, .norm_eps = 1e-5f};
    struct ckpt_save_args a = {.dir = dir, .step = 1, .layout = topology_layout(1, 1, 1, 0, 1), .model = &m,
                               .tokenizer_id = "", .pieces = p, .n_pieces = 3 * n_tensors};
    struct error err = {0};
    t0 = time_now_s();
    if (checkpoint_save(&a, &self, &err)) {
        printf("save failed: %s\n", err.msg);
        return 1;
    }
    double save_s = time_now_s() - t0;
    printf("  checkpoint_save              %6.2f s  %6.2f GB/s  (%.2fx dd)\n", save_s, gb / save_s,
           (gb / save_s) / (1.073741824 / dd_s));

    // The same pieces saved asynchronously (checkpoint.async) as the trainer
    // does: the pieces copied into host buffers allocated (and touched) once,
    // as train_ckpt.c's stay from one save to the next (a device-to-host copy
    // under CUDA), then checkpoint_save_begin without a copy. The stall is
    // what the training thread waits for: that copy and the begin (the .tmp
    // folder), plus the two agreements (checkpoint_save_advance: once the
    // writers are done, once rank 0's commit is); meanwhile this thread polls
    // every 10 ms as the trainer's step boundaries would.
    struct ckpt_piece *q = xcalloc((size_t)3 * n_tensors, sizeof *q);
    for (int i = 0; i < 3 * n_tensors; i++) {
        q[i] = p[i];
        q[i].data = xmalloc(p[i].flat_end * sizeof(float));
        memset(q[i].data, 0, p[i].flat_end * sizeof(float)); // touched: resident, as after a first save
    }
    a.step = 2, a.pieces = q;
    struct ckpt_async *h;
    t0 = time_now_s();
    for (int i = 0; i < 3 * n_tensors; i++) memcpy(q[i].data, p[i].data, p[i].flat_end * sizeof(float));
    double copy_s = time_now_s() - t0;
    if (checkpoint_save_begin(&a, false, &self, &h, &err)) {
        printf("async save failed: %s\n", err.msg);
        return 1;
    }
    double begin_s = time_now_s() - t0, w0 = time_now_s(), advance_s = 0;
    int polls = 0;
    while (h) { // the trainer's step boundaries: advance once the background work is done
        if (checkpoint_save_writer_state(h) == 0) {
            usleep(10000), polls++;
            continue;
        }
        t0 = time_now_s();
        if (checkpoint_save_advance(&h, &self, NULL, &err)) {
            printf("async save failed: %s\n", err.msg);
            return 1;
        }
        advance_s += time_now_s() - t0;
    }
    double written_s = time_now_s() - w0, commit_s = advance_s, stall_s = begin_s + commit_s;
    printf("  async save: stall            %6.2f s  (snapshot copy %.2f s, begin %.2f s, the two "
           "agreements %.2f s; written and committed %.2f s in the background, %d polls)\n", stall_s,
           copy_s, begin_s - copy_s, commit_s, written_s, polls);
    for (int i = 0; i < 3 * n_tensors; i++) free(q[i].data);
    free(q);
    printf("  async stall / sync save      %6.1f %%  (goal <= 10 %%)\n", 100 * stall_s / save_s);

    t0 = time_now_s();
    struct ckpt_reader *r;
    if (checkpoint_open(dir, &r, &err)) {
        printf("open failed: %s\n", err.msg);
        return 1;
    }
    double open_s = time_now_s() - t0;
    int bad = 0;
    for (int i = 0; i < 3 * n_tensors; i++) {
        struct ckpt_piece want = p[i];
        float *orig = p[i].data;
        want.data = xmalloc(want.flat_end * sizeof(float));
        if (checkpoint_read_piece(r, &want, &err)) {
            printf("read failed: %s\n", err.msg);
            return 1;
        }
        bad += memcmp(want.data, orig, want.flat_end * sizeof(float)) != 0;
        free(want.data);
    }
    double load_s = time_now_s() - t0;
    checkpoint_close(r);
    printf("  checkpoint_open (checksums)  %6.2f s  %6.2f GB/s\n", open_s, gb / open_s);
    printf("  open + read every tensor     %6.2f s  %6.2f GB/s  (page cache warm; %d differ)\n",
           load_s, gb / load_s, bad);
    // dd again: the disk is shared, its rate varies from minute to minute.
    snprintf(cmd, sizeof cmd, "dd if=/dev/zero of=%s/x bs=1M count=1024 conv=fsync status=none", dir);
    t0 = time_now_s();
    if (system(cmd)) return 1;
    dd_s = time_now_s() - t0;
    printf("  dd 1 GiB conv=fsync, again   %6.2f s  %6.2f GB/s\n", dd_s, 1.073741824 / dd_s);
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd)) return 1;
    for (int i = 0; i < 3 * n_tensors; i++) free(p[i].data);
    free(p);
    return bad ? 1 : 0;
}
